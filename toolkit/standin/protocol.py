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
import os
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


# A request body larger than this is parsed (and its prompt tokenized) in a worker thread, not on the event loop.
OFFLOAD_BYTES = 64 << 10
KV_RELEASE_PATH = "/standin/kv/release"  # a stand-in endpoint (see proxy.py: a failed generation leg)


class RefusalLog:
    """One log line per refused request (4xx): method, path, status and reason, bounded.

    TensorRT-LLM's disaggregated server logs request-validation failures as ``[validation] METHOD PATH 400 (n=N):
    errors`` with control characters escaped, throttled to the first and every 1000th
    (``openai_disagg_server.py`` ``validation_exception_handler``, newest stored version). The stand-in logs every
    refusal in that shape (a rehearsal wants each one) but bounds it: the reason is cut to ``MAX_REASON``
    characters, and beyond ``PER_SECOND`` lines in one second the rest are counted and reported on the next line.
    """

    MAX_REASON = 300
    PER_SECOND = 20
    _CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)}

    def __init__(self, logger):
        self.log = logger
        self.count = 0
        self.window = 0
        self.in_window = 0
        self.suppressed = 0

    def note(self, method: str, path: str, status: int, reason: str) -> None:
        self.count += 1
        now = int(time.monotonic())
        if now != self.window:
            self.window, self.in_window = now, 0
        self.in_window += 1
        if self.in_window > self.PER_SECOND:
            self.suppressed += 1
            return
        reason = str(reason).translate(self._CONTROL)
        if len(reason) > self.MAX_REASON:
            reason = reason[:self.MAX_REASON] + "..."
        extra = f" ({self.suppressed} more refused, not logged)" if self.suppressed else ""
        self.suppressed = 0
        self.log.warning("[refused] %s %s %d (n=%d): %s%s", method.translate(self._CONTROL),
                         path[:200].translate(self._CONTROL), status, self.count, reason, extra)


def error_reason(body: bytes | None) -> str:
    """The message of an error body (ErrorResponse ``message``, FastAPI ``detail``, the proxy's ``error``)."""
    if not body:
        return ""
    try:
        doc = json.loads(body)
    except ValueError:
        try:
            doc = msgpack.unpackb(body, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException):  # neither JSON nor msgpack: the text itself
            return body[:500].decode(errors="replace")
    if isinstance(doc, dict):
        for key in ("message", "detail", "error"):
            if doc.get(key):
                return str(doc[key])
    return str(doc)[:500]


def error_middleware(refusals: RefusalLog):
    """aiohttp middleware: unknown routes and methods answered as FastAPI does (trtllm-serve and its disaggregated
    server are FastAPI apps; Starlette's default for an unmatched route is 404 ``{"detail": "Not Found"}``, for a
    route without that method 405 ``{"detail": "Method Not Allowed"}``), and every 4xx logged once."""
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            if exc.status not in (404, 405):
                raise
            detail = "Not Found" if exc.status == 404 else "Method Not Allowed"
            resp = web.json_response({"detail": detail}, status=exc.status,
                                     headers={"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None)
        if 400 <= resp.status < 500:
            refusals.note(request.method, request.path, resp.status,
                          error_reason(getattr(resp, "body", None)) or resp.reason)
        return resp
    return middleware


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


# Request fields, from TensorRT-LLM's ``tensorrt_llm/serve/openai_protocol.py`` (NVIDIA/TensorRT-LLM commit
# 0076e9390e1ed11515f149eec356f5a03f4a00d8): ``OpenAIBaseModel`` is ``ConfigDict(extra="forbid")``, so a field that
# is not one of these is a validation error (HTTP 400) on a worker and on the disaggregated proxy alike. These are
# the newest line's fields; an older line knows fewer (the stand-in accepts the newest set for every line).
COMPLETION_FIELDS = frozenset((
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    "lora_request", "prompt_ignore_length", "use_beam_search", "top_k", "top_p_min", "min_p", "repetition_penalty",
    "length_penalty", "early_stopping", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "return_context_logits",
    "detokenize", "thinking_token_budget", "add_special_tokens", "response_format", "disaggregated_params",
    "priority", "conversation_params"))
CHAT_FIELDS = frozenset((
    "messages", "prompt_token_ids", "prompt_token_ids_b64", "model", "frequency_penalty", "logit_bias", "logprobs",
    "top_logprobs", "max_completion_tokens", "max_tokens", "n", "presence_penalty", "response_format", "seed", "stop",
    "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "user",
    "reasoning_effort", "thinking", "thinking_token_budget", "prompt_ignore_length", "best_of", "use_beam_search",
    "top_k", "top_p_min", "min_p", "repetition_penalty", "length_penalty", "early_stopping", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "lora_request", "echo", "add_generation_prompt", "add_special_tokens", "documents",
    "chat_template", "chat_template_kwargs", "injected_chat_template_kwargs", "media_io_kwargs",
    "disaggregated_params", "conversation_params", "cache_salt", "priority", "agent_hierarchy",
    "mm_processor_kwargs"))


class ValidationError(RequestError):
    """A request the protocol models themselves refuse (pydantic: an unknown field, a wrong type, a model validator).

    On a worker it is answered as every error (``ErrorResponse``, 400). TensorRT-LLM's disaggregated proxy parses the
    body with the same models, and its ``RequestValidationError`` handler answers ``{"error": str(exc)}`` with 400
    (``tensorrt_llm/serve/openai_disagg_server.py``, ``validation_exception_handler``; the same in commit
    3e53e4adfea6e24674eaec876c3009551cb25134 and in the newest stored version), before any leg is sent.
    """

    def __init__(self, model: str, loc: str, message: str, kind: str):
        super().__init__(400, f"1 validation error for {model}\n{loc}\n  {message} [type={kind}]")


@dataclass
class Limits:
    """A worker's request limits (what ``_check_limits`` applies), as ``/server_info`` reports them."""

    max_num_tokens: int
    max_seq_len: int
    chunked_prefill: bool = False
    max_input_len: int | None = None

    def check(self, n: int, request_type: str = "context_and_generation") -> None:
        """The pytorch backend's limits on a prompt of ``n`` tokens (wording from TensorRT-LLM, see worker.py)."""
        if request_type != "generation_only" and not self.chunked_prefill and n > self.max_num_tokens:
            raise RequestError(400, f"The sum of prompt length ({float(n)}), query length (0) should not exceed "
                                    f"max_num_tokens ({self.max_num_tokens})")
        if self.max_input_len is not None and n > self.max_input_len:
            raise RequestError(400, f"The prompt length ({n}) exceeds max_input_len ({self.max_input_len})")
        if n >= self.max_seq_len:
            raise RequestError(400, f"`default_max_tokens` ({self.max_seq_len - n}) must be greater than 0, "
                                    f"`default_max_tokens` ({self.max_seq_len - n}) = max_seq_len ({self.max_seq_len}) "
                                    f"- `splited_prompt_len` ({n}) - `query_token_len` (0)")

    def to_dict(self) -> dict:
        return {"max_num_tokens": self.max_num_tokens, "max_seq_len": self.max_seq_len,
                "chunked_prefill": self.chunked_prefill, "max_input_len": self.max_input_len}

    @classmethod
    def from_dict(cls, doc: dict) -> Limits:
        return cls(int(doc["max_num_tokens"]), int(doc["max_seq_len"]), bool(doc.get("chunked_prefill")),
                   doc.get("max_input_len"))


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
    n: int = 1
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-k count: completions' ``logprobs``; chat's ``top_logprobs`` (0 = chosen only)
    echo: bool = False
    echo_text: str = ""  # what echo prepends (completions: the prompt; chat: the last message's content)


def _token_list(value, what: str) -> list[int]:
    # JSON and msgpack give plain ints: checked by type (a bool is not one), the range by min and max (a 2048-id
    # prompt in about a tenth of the time of a check per id, on every generation leg)
    if not all(type(t) is int for t in value):
        raise RequestError(400, f"{what} must be a string or a list of integer token ids")
    if value and (min(value) < 0 or max(value) >= M.VOCAB_SIZE):
        bad = next(t for t in value if not 0 <= t < M.VOCAB_SIZE)
        raise RequestError(400, f"{what}: token id {bad} is outside the vocabulary [0, {M.VOCAB_SIZE})")
    return list(value)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and v == v


def check_fields(kind: str, body: dict) -> None:
    """What the pydantic models of openai_protocol.py refuse (field names, types, model validators)."""
    model = "CompletionRequest" if kind == "completion" else "ChatCompletionRequest"
    allowed = COMPLETION_FIELDS if kind == "completion" else CHAT_FIELDS
    extra = sorted(k for k in body if k not in allowed)
    if extra:
        raise ValidationError(model, extra[0], f"Extra inputs are not permitted (input_value={body[extra[0]]!r})",
                              "extra_forbidden")

    def typed(name, ok, what):
        v = body.get(name)
        if v is not None and not ok(v):
            raise ValidationError(model, name, f"Input should be {what} (input_value={v!r})", "type_error")
    for name in ("max_tokens", "max_completion_tokens", "n", "best_of", "seed", "top_k", "min_tokens"):
        typed(name, _is_int, "a valid integer")
    for name in ("temperature", "top_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p"):
        typed(name, _is_num, "a valid number")
    for name in ("stream", "echo", "include_stop_str_in_output", "ignore_eos"):
        typed(name, lambda v: isinstance(v, bool), "a valid boolean")
    typed("stop", lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
          "a valid string or a list of strings")
    typed("stream_options", lambda v: isinstance(v, dict) and set(v) <= {"include_usage", "continuous_usage_stats"},
          "a StreamOptions object {include_usage, continuous_usage_stats}")
    if kind == "completion":
        typed("logprobs", _is_int, "a valid integer")
        # CompletionRequest.validate_stream_options / check_suffix (model validators)
        if body.get("stream_options") and not body.get("stream"):
            raise ValidationError(model, "", "Value error, Stream options can only be defined when stream is true.",
                                  "value_error")
    else:
        typed("logprobs", lambda v: isinstance(v, bool), "a valid boolean")
        typed("top_logprobs", _is_int, "a valid integer")
        # ChatCompletionRequest.validate_stream_options / check_logprobs (model validators)
        if body.get("stream_options") is not None and not body.get("stream"):
            raise ValidationError(model, "", "Value error, stream_options can only be set if stream is true",
                                  "value_error")
        if body.get("top_logprobs") is not None and not body.get("logprobs"):
            raise ValidationError(model, "", "Value error, logprobs must be true when using top_logprobs",
                                  "value_error")
    if body.get("suffix"):
        raise ValidationError(model, "", "Value error, suffix is not supported", "value_error")
    for name in ("logprobs", "top_logprobs"):
        v = body.get(name)
        if _is_int(v) and v < 0:
            raise ValidationError(model, name, f"Value error, {name} must be non-negative, got {v}", "value_error")


def _check_sampling(body: dict) -> None:
    """What the engine refuses once the request is built (the worker's answer is a 400 ErrorResponse)."""
    n = body.get("n")
    n = 1 if n is None else n
    if n < 1:
        raise RequestError(400, f"n must be at least 1, got {n}")
    best_of = body.get("best_of")
    best_of = n if best_of is None else best_of
    # tensorrt_llm/sampling_params.py SamplingParams._validate (commit 000a01de66f0eab4ab05640711f0253f50f5209c)
    if best_of < n:
        raise RequestError(400, f"best_of ({best_of}) cannot be less than n ({n})")
    top_k, top_p = body.get("top_k", 0), body.get("top_p")
    top_p = 1.0 if top_p is None else top_p  # openai_protocol.to_sampling_params: top_p None -> 1.0
    greedy = not body.get("use_beam_search") and top_k in (None, 1) and top_p == 0.0
    if best_of > 1 and greedy:
        raise RequestError(400, f"Greedy decoding in the LLM API does not allow multiple returns. Please set to "
                                f"best_of=1, got best_of={best_of}. Please set to best_of=1 or set an environment "
                                f"variable TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy "
                                f"decoding.")
    # cpp/tensorrt_llm/executor/samplingConfig.cpp SamplingConfig::checkTemperature: TLLM_CHECK(temperature >= 0)
    t = body.get("temperature")
    if t is not None and t < 0:
        raise RequestError(400, f"temperature must be >= 0 (SamplingConfig::checkTemperature), got {t}")


def _completion_prompt(body: dict) -> tuple[list[int], str]:
    """A completion's prompt as token ids, and what echo prepends: one string, or one list of token ids (a
    one-element batch of either is unwrapped)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return M.encode(prompt), prompt
    if not isinstance(prompt, list):
        raise RequestError(400, "prompt is required: a string or a list of token ids")
    if prompt and isinstance(prompt[0], (str, list)):
        raise RequestError(400, f"the stand-in serves one prompt per request ({len(prompt)} given)")
    ids = _token_list(prompt, "prompt")
    return ids, M.decode(ids)


def _chat_prompt(body: dict) -> tuple[list[int], str]:
    """A chat's prompt as token ids (its messages through the chat template, or the proxy's generation leg's
    prompt_token_ids), and what echo prepends."""
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
    # ChatCompletionRequest.echo: "the new message will be prepended with the last message if they belong
    # to the same role" (the answer's role is assistant)
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict) \
            and messages[-1].get("role") == "assistant":
        return ids, M.message_text(messages[-1])
    return ids, ""


def _disaggregated_params(body: dict) -> tuple[dict, str]:
    """disaggregated_params and its request type (context_and_generation without it); only the context-first
    schedule is emulated."""
    disagg = body.get("disaggregated_params") or {}
    if not isinstance(disagg, dict):
        raise RequestError(400, "disaggregated_params must be an object")
    rtype = str(disagg.get("request_type") or "context_and_generation").lower()
    if disagg and rtype not in REQUEST_TYPES:
        raise RequestError(400, f"disaggregated_params.request_type {disagg.get('request_type')!r} is not one of "
                                f"{', '.join(REQUEST_TYPES)}")
    style = disagg.get("schedule_style")
    if style is not None and not _is_int(style):
        raise RequestError(400, f"disaggregated_params.schedule_style must be an integer (DisaggScheduleStyle: "
                                f"0 = CONTEXT_FIRST, 1 = GENERATION_FIRST), got {style!r}")
    if style == 1:
        raise RequestError(400, "disaggregated_params.schedule_style 1 (GENERATION_FIRST) is not emulated by the "
                                "stand-in; use context_first")
    return disagg, rtype


def _top_logprobs(kind: str, body: dict) -> int | None:
    """How many top logprobs each token reports (0: the chosen one only), or None for none."""
    if kind == "completion":
        return body.get("logprobs") or None  # openai_protocol: `if self.logprobs:` (0 = none)
    return (body.get("top_logprobs") or 0) if body.get("logprobs") else None


def parse_request(kind: str, body: dict, limits=()) -> Request:
    """The one validation of a client's request, shared by the workers and the proxy (before any leg).

    ``limits``: ``(Limits, request_type)`` pairs to apply to the prompt as well (the proxy passes its context
    servers' as ``context_and_generation`` and its generation servers' as ``generation_only``; a worker applies its
    own afterwards, knowing the request type).
    """
    check_fields(kind, body)
    _check_sampling(body)
    ids, echo_text = _completion_prompt(body) if kind == "completion" else _chat_prompt(body)
    if not ids:
        raise RequestError(400, "the prompt is empty (no tokens)")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    disagg, rtype = _disaggregated_params(body)
    for lim, as_type in limits:
        lim.check(len(ids), as_type)
    stop = body.get("stop") or []
    opts = body.get("stream_options") or {}
    return Request(kind=kind, model=str(body.get("model") or ""), prompt_ids=ids, max_tokens=max_tokens,
                   stream=bool(body.get("stream")), include_usage=bool(opts.get("include_usage", True)) if opts else False,
                   request_type=rtype, disagg=disagg, n=body.get("n") or 1,
                   stop=[stop] if isinstance(stop, str) else [s for s in stop if s],
                   include_stop_str_in_output=bool(body.get("include_stop_str_in_output")),
                   logprobs=_top_logprobs(kind, body), echo=bool(body.get("echo")), echo_text=echo_text)


# --- responses ----------------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI usage; ``prompt_tokens_details.cached_tokens``: the prompt tokens the engine reused from its KV cache
    (TensorRT-LLM reports it on every response; aiperf reads it as ``usage_prompt_cache_read_tokens``)."""
    use = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
           "completion_tokens": completion_tokens}
    if cached_tokens is not None:
        use["prompt_tokens_details"] = {"cached_tokens": int(cached_tokens)}
    return use


def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex


@dataclass
class Choice:
    """One answer of a request after the sampling controls the stand-in honours (stop, logprobs, echo)."""

    index: int
    tokens: list[int]  # the generated tokens it counts (usage), up to the one that completed a stop string
    pieces: list[str]  # the text each of them adds (the last one cut before a stop string)
    finish_reason: str
    stop_reason: str | None
    logprobs: list[list[tuple[int, float]]] | None  # per token: the top-k (token, logprob), the chosen one first
    echo: str = ""


def make_choice(req: Request, index: int, tokens: list[int]) -> Choice:
    """Apply ``stop`` (text cut before the earliest stop string, ``finish_reason: stop``, ``stop_reason`` = the
    string; ``include_stop_str_in_output`` keeps it: SamplingParams' documented semantics), ``logprobs`` and
    ``echo`` to the generated ``tokens``. Stop strings are matched in the generated text (the stand-in's tokens are
    hashes, so TensorRT-LLM's token-level match of the tokenized stop string cannot be reproduced); the answer ends
    with the token that completes the stop string."""
    fault = _retokenize_fault()
    pieces = [" " + M.answer_word(t, fault) for t in tokens]
    finish, stop_reason = "length", None
    if req.stop:
        text = "".join(pieces)
        hits = [(text.find(s), s) for s in req.stop if text.find(s) >= 0]
        if hits:
            pos, stop_reason = min(hits, key=lambda h: (h[0], -len(h[1])))
            end = pos + len(stop_reason)
            cut = end if req.include_stop_str_in_output else pos
            keep, acc = 0, 0
            for keep, piece in enumerate(pieces, start=1):  # noqa: B007 (keep is read after the loop)
                acc += len(piece)
                if acc >= end:
                    break
            out, acc = [], 0
            for piece in pieces[:keep]:
                out.append(piece[:max(0, min(len(piece), cut - acc))])
                acc += len(piece)
            pieces, tokens, finish = out, tokens[:keep], "stop"
    lps = None
    if req.logprobs is not None:
        prev = [req.prompt_ids[-1], *tokens[:-1]]
        lps = [M.top_logprobs(i, prev[i], t, req.logprobs) for i, t in enumerate(tokens)]
    return Choice(index=index, tokens=tokens, pieces=pieces, finish_reason=finish, stop_reason=stop_reason,
                  logprobs=lps, echo=req.echo_text if req.echo else "")


def _word(token: int) -> str:
    return " " + M.answer_word(token, _retokenize_fault())


def _retokenize_fault() -> bool:
    """TK_STANDIN_FAULT=retokenize (see toolkit.standin.kv's faults): answers whose text does not re-tokenize to
    the generated ids."""
    return "retokenize" in {f.strip() for f in os.environ.get("TK_STANDIN_FAULT", "").split(",")}


def completion_logprobs(c: Choice, first: int = 0, last: int | None = None, offset: int = 0) -> dict:
    """OpenAI's completion ``logprobs`` object (``CompletionLogProbs``) for tokens ``first:last`` of ``c``; text
    offsets count from ``offset`` (the characters of the answer before token ``first``)."""
    last = len(c.tokens) if last is None else last
    out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for i in range(first, last):
        top = c.logprobs[i]
        out["text_offset"].append(offset)
        out["tokens"].append(_word(c.tokens[i]))
        out["token_logprobs"].append(top[0][1])
        out["top_logprobs"].append({_word(t): lp for t, lp in top})
        offset += len(c.pieces[i])
    return out


def chat_logprobs(c: Choice, first: int = 0, last: int | None = None, k: int = 0) -> dict:
    """The chat ``logprobs`` object (``ChatCompletionLogProbs``): ``content``, one entry per token."""
    last = len(c.tokens) if last is None else last

    def entry(t, lp):
        w = _word(t)
        return {"token": w, "logprob": lp, "bytes": list(w.encode())}
    return {"content": [{**entry(*c.logprobs[i][0]), "top_logprobs": [entry(t, lp) for t, lp in c.logprobs[i][:k]]}
                        for i in range(first, last)]}


def response(kind: str, rid: str, model: str, choices: list[Choice], use: dict, disagg_params: dict | None = None,
             prompt_token_ids: list[int] | None = None, top_k: int = 0) -> dict:
    out = []
    for c in choices:
        text = c.echo + "".join(c.pieces)
        if kind == "completion":
            lp = completion_logprobs(c, offset=len(c.echo)) if c.logprobs is not None else None
            choice = {"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish_reason,
                      "stop_reason": c.stop_reason, "disaggregated_params": disagg_params}
        else:
            lp = chat_logprobs(c, k=top_k) if c.logprobs is not None else None
            choice = {"index": c.index, "message": {"role": "assistant", "content": text},
                      "logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                      "disaggregated_params": disagg_params}
        out.append(choice)
    obj = "text_completion" if kind == "completion" else "chat.completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": out,
            "usage": use, "prompt_token_ids": prompt_token_ids}


def stream_chunks(kind: str, rid: str, model: str, choice: Choice, top_k: int = 0):
    """The server-sent event payloads (dicts) of one choice of a streamed answer, one token per chunk (chat opens
    with a role chunk); the caller adds the usage chunk and ``[DONE]``."""
    created = int(time.time())
    if kind == "chat":
        yield {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]}
    offset = 0
    for i, piece in enumerate(choice.pieces):
        last = i == len(choice.pieces) - 1
        if i == 0 and choice.echo:  # echo: the prompt (or the last assistant message) opens the first chunk
            piece = choice.echo + piece
            offset = len(choice.echo)
        finish = choice.finish_reason if last else None
        stop = choice.stop_reason if last else None
        if kind == "completion":
            lp = completion_logprobs(choice, i, i + 1, offset) if choice.logprobs is not None else None
            c = {"index": choice.index, "text": piece, "logprobs": lp, "finish_reason": finish, "stop_reason": stop}
            obj = "text_completion"
        else:
            lp = chat_logprobs(choice, i, i + 1, top_k) if choice.logprobs is not None else None
            c = {"index": choice.index, "delta": {"content": piece}, "logprobs": lp, "finish_reason": finish,
                 "stop_reason": stop}
            obj = "chat.completion.chunk"
        offset += len(choice.pieces[i])
        yield {"id": rid, "object": obj, "created": created, "model": model, "choices": [c]}


def usage_chunk(kind: str, rid: str, model: str, use: dict) -> dict:
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [], "usage": use}


def sse(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
