"""A small client for the OpenAI-compatible API that trtllm-serve, its proxy and the stand-in speak.

Used by `tk launch`'s smoke request, the demo, the benchmarks and the tests:

    text = complete("http://host:8000", "tk/standin-tiny", "Hello", max_tokens=8, stream=True)
"""

from __future__ import annotations

import json

import requests


class CompletionError(Exception):
    """The server answered, but not with a completion."""


def complete(base_url: str, model: str, prompt: str, *, max_tokens: int = 12, stream: bool = False,
             chat: bool = False, timeout_s: float = 60) -> str:
    """The generated text of one greedy request; a streamed answer is joined from its server-sent events."""
    if chat:
        path = "/v1/chat/completions"
        body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    else:
        path = "/v1/completions"
        body = {"model": model, "prompt": prompt}
    body.update(max_tokens=max_tokens, temperature=0, stream=stream)
    resp = requests.post(base_url.rstrip("/") + path, json=body, timeout=timeout_s, stream=stream)
    if resp.status_code != 200:
        raise CompletionError(f"{path} answered HTTP {resp.status_code}: {resp.text[:500]}")
    if not stream:
        try:
            choice = resp.json()["choices"][0]
            return choice["message"]["content"] if chat else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise CompletionError(f"{path} answered an unexpected body: {resp.text[:500]}") from None
    return "".join(_stream_pieces(resp, chat))


def _stream_pieces(resp: requests.Response, chat: bool):
    for line in resp.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        try:
            doc = json.loads(data)
        except ValueError:
            raise CompletionError(f"unparseable server-sent event: {data[:200]}") from None
        if "error" in doc:
            raise CompletionError(f"error in stream: {doc['error']}")
        choice = doc["choices"][0]
        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        yield piece or ""
    raise CompletionError("the stream ended without `data: [DONE]`")
