"""The HTTP protocol trtllm-serve speaks, as the stand-in needs it (tk CPU stand-in, not TensorRT-LLM).

Field names follow TensorRT-LLM's ``tensorrt_llm/serve/openai_protocol.py``:
- ``CompletionResponse``/``ChatCompletionResponse`` carry ``prompt_token_ids`` at the top level (added for
  context_only requests so the generation server need not tokenize); each choice carries
  ``disaggregated_params``.
- ``DisaggregatedParams``: ``request_type`` (context_only | generation_only | context_and_generation),
  ``first_gen_tokens``, ``ctx_request_id``, ``encoded_opaque_state`` (base64), ``draft_tokens``,
  ``disagg_request_id``, ``ctx_dp_rank``, ``ctx_info_endpoint``, ``schedule_style`` (integer:
  0 = CONTEXT_FIRST, 1 = GENERATION_FIRST).
- Errors: ``{"object": "error", "message", "type", "param", "code"}`` with the same HTTP status.
- Only fields every supported line knows are emitted (TensorRT-LLM's models forbid extra fields, so a proxy of
  an older line would reject newer ones): ``disagg_request_id`` and ``schedule_style`` are echoed only when the
  request carried them; ``ctx_dp_rank``, ``ctx_info_endpoint``, ``ctx_usage`` are never set.
- Request bodies are JSON, or msgpack when the header ``X-TRTLLM-Msgpack: 1`` is set (the proxy keeps
  ``Content-Type: application/json``). Responses are JSON, as TensorRT-LLM's; the stand-in additionally answers
  msgpack when the client sends ``Accept: application/msgpack`` (a stand-in convenience, not TensorRT-LLM).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import msgpack

from toolkit.standin import model as M

MSGPACK_HEADER = "X-TRTLLM-Msgpack"
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
REQUEST_TYPES = ("context_only", "generation_only", "context_and_generation")
OWNED_BY = "tk CPU stand-in, not TensorRT-LLM"


class RequestError(Exception):
    """Answered as an OpenAI-style error with this HTTP status."""

    def __init__(self, status: int, message: str, type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or ("BadRequestError" if status < 500 else "InternalServerError")

    def body(self) -> dict:
        return {"object": "error", "message": self.message, "type": self.type, "param": None, "code": self.status}


def decode_body(raw: bytes, headers) -> dict:
    try:
        if headers.get(MSGPACK_HEADER) == "1":
            doc = msgpack.unpackb(raw, raw=False)
        else:
            doc = json.loads(raw or b"null")
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the client's
        kind = "msgpack" if headers.get(MSGPACK_HEADER) == "1" else "JSON"
        raise RequestError(400, f"the request body is not valid {kind}: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(400, "the request body must be an object")
    return doc


def wants_msgpack(headers) -> bool:
    accept = headers.get("Accept", "")
    return any(t in accept for t in MSGPACK_TYPES)


def encode_body(doc: dict, headers) -> tuple[bytes, str]:
    if wants_msgpack(headers):
        return msgpack.packb(doc, use_bin_type=True), "application/msgpack"
    return json.dumps(doc).encode(), "application/json"


@dataclass
class Request:
    kind: str  # "completion" | "chat"
    model: str
    prompt_ids: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    request_type: str
    disagg: dict = field(default_factory=dict)


def _token_list(value, what: str) -> list[int]:
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise RequestError(400, f"{what} must be a string or a list of integer token ids")
    bad = [t for t in value if not 0 <= t < M.VOCAB_SIZE]
    if bad:
        raise RequestError(400, f"{what}: token id {bad[0]} is outside the vocabulary [0, {M.VOCAB_SIZE})")
    return list(value)


def parse_request(kind: str, body: dict) -> Request:
    n = body.get("n", 1)
    if n not in (1, None):
        raise RequestError(400, f"n={n}: the stand-in returns one choice per request")
    if body.get("stream_options") and not body.get("stream"):
        raise RequestError(400, "Stream options can only be defined when stream is true.")
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = M.encode(prompt)
        elif isinstance(prompt, list):
            if prompt and isinstance(prompt[0], (str, list)):
                raise RequestError(400, f"the stand-in serves one prompt per request ({len(prompt)} given)")
            ids = _token_list(prompt, "prompt")
        else:
            raise RequestError(400, "prompt is required: a string or a list of token ids")
    else:
        messages = body.get("messages")
        if body.get("prompt_token_ids") is not None:  # the proxy's generation leg
            ids = _token_list(body["prompt_token_ids"], "prompt_token_ids")
        elif isinstance(messages, list) and messages:
            try:
                ids = M.encode(M.chat_prompt(messages))
            except (TypeError, ValueError) as exc:
                raise RequestError(400, f"messages: {exc}") from None
        else:
            raise RequestError(400, "messages is required: a non-empty list of {role, content}")
    if not ids:
        raise RequestError(400, "the prompt is empty (no tokens)")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise RequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    disagg = body.get("disaggregated_params") or {}
    if not isinstance(disagg, dict):
        raise RequestError(400, "disaggregated_params must be an object")
    rtype = str(disagg.get("request_type") or "context_and_generation").lower()
    if disagg and rtype not in REQUEST_TYPES:
        raise RequestError(400, f"disaggregated_params.request_type {disagg.get('request_type')!r} is not one of "
                                f"{', '.join(REQUEST_TYPES)}")
    style = disagg.get("schedule_style")
    if style is not None and (not isinstance(style, int) or isinstance(style, bool)):
        raise RequestError(400, f"disaggregated_params.schedule_style must be an integer (DisaggScheduleStyle: "
                                f"0 = CONTEXT_FIRST, 1 = GENERATION_FIRST), got {style!r}")
    if style == 1:
        raise RequestError(400, "disaggregated_params.schedule_style 1 (GENERATION_FIRST) is not emulated by the "
                                "stand-in; use context_first")
    opts = body.get("stream_options") or {}
    return Request(kind=kind, model=str(body.get("model") or ""), prompt_ids=ids, max_tokens=max_tokens,
                   stream=bool(body.get("stream")), include_usage=bool(opts.get("include_usage", True)) if opts else False,
                   request_type=rtype, disagg=disagg)


# --- responses ----------------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex


def response(kind: str, rid: str, model: str, text: str, finish_reason: str, use: dict,
             disagg_params: dict | None = None, prompt_token_ids: list[int] | None = None) -> dict:
    if kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None,
                  "disaggregated_params": disagg_params}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None,
                  "disaggregated_params": disagg_params}
        obj = "chat.completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": use, "prompt_token_ids": prompt_token_ids}


def stream_chunks(kind: str, rid: str, model: str, pieces: list[str], finish_reason: str):
    """The server-sent event payloads (dicts) of one streamed answer, before ``[DONE]`` and the usage chunk."""
    created = int(time.time())
    if kind == "chat":
        yield {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]}
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        if kind == "completion":
            choice = {"index": 0, "text": piece, "logprobs": None,
                      "finish_reason": finish_reason if last else None, "stop_reason": None}
            obj = "text_completion"
        else:
            choice = {"index": 0, "delta": {"content": piece}, "logprobs": None,
                      "finish_reason": finish_reason if last else None}
            obj = "chat.completion.chunk"
        yield {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def usage_chunk(kind: str, rid: str, model: str, use: dict) -> dict:
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [], "usage": use}


def sse(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
