"""Spec: a stand-in worker refuses a request it cannot serve before the request takes a batch slot, with
TensorRT-LLM's error body (400, the message naming what is wrong), the first problem in the order it checks them.
The worker is built but never listens: nothing spawned, no port bound."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from multidict import CIMultiDict

from toolkit.standin.kv import TransferError, decode_state
from toolkit.standin.options import VERSION_ENV, worker_settings
from toolkit.standin.worker import Worker

LIMITS = {"max_batch_size": 8, "max_num_tokens": 64, "max_seq_len": 100}
TRANSCEIVER = {"cache_transceiver_config": {"backend": "NIXL", "max_tokens_in_buffer": 256}}


class _Request:
    """What Worker.generate reads of an aiohttp request: the body and the headers."""

    def __init__(self, body):
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.headers = CIMultiDict({"Content-Type": "application/json"})

    async def read(self) -> bytes:
        return self.body


def _worker(tmp_path, monkeypatch, disaggregated: bool) -> Worker:
    monkeypatch.setenv(VERSION_ENV, "1.2")
    path = tmp_path / "options.yaml"
    path.write_text(yaml.safe_dump({**LIMITS, **(TRANSCEIVER if disaggregated else {})}))
    return Worker(worker_settings(["tk/standin-tiny", "--host", "127.0.0.1", "--port", "19000",
                                   "--extra_llm_api_options", str(path)]))


def _refusal(worker: Worker, body) -> str:
    response = asyncio.run(worker.generate(_Request(body), "completion"))
    doc = json.loads(response.body)
    assert response.status == 400 and (doc["object"], doc["code"]) == ("error", 400)
    assert worker.counters["errors"] == 1
    assert (worker.active, worker.queued, worker.completed) == (0, 0, 0)  # it never took a batch slot
    assert sum(worker.counters["requests"].values()) == 0
    return doc["message"]


def _leg(request_type: str, **params) -> dict:
    return {"model": "m", "prompt": "x", "disaggregated_params": {"request_type": request_type, **params}}


@pytest.mark.parametrize("disaggregated,body,message", [
    (False, _leg("context_only"), "disaggregated_params.request_type context_only: this server's cache transceiver "
     "is disabled (no cache_transceiver_config.backend in {options}), it serves whole requests only"),
    (True, {**_leg("context_only"), "n": 2}, "n=2: a context_only leg carries one sequence (TensorRT-LLM's "
     "disaggregated proxy expects one choice from the context server)"),
    (False, {**_leg("context_only"), "n": 2}, "n=2: a context_only leg carries one sequence (TensorRT-LLM's "
     "disaggregated proxy expects one choice from the context server)"),  # the first problem is named
    (True, _leg("generation_only", ctx_request_id=3), "generation_only request without "
     "disaggregated_params.first_gen_tokens and ctx_request_id"),
    (True, _leg("generation_only", first_gen_tokens=[5]), "generation_only request without "
     "disaggregated_params.first_gen_tokens and ctx_request_id"),
    (True, {**_leg("context_only"), "prompt": " ".join(["w"] * 70)},
     "The sum of prompt length (70.0), query length (0) should not exceed max_num_tokens (64)"),
    (True, b"{not json", "the request body is not valid JSON: Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)"),
    (False, [1], "the request body must be an object"),
])
def test_a_request_the_server_cannot_serve_is_refused_before_it_takes_a_batch_slot(tmp_path, monkeypatch,
                                                                                   disaggregated, body, message):
    worker = _worker(tmp_path, monkeypatch, disaggregated)
    assert _refusal(worker, body) == message.format(options=tmp_path / "options.yaml")


@pytest.mark.parametrize("state", [None, "!!"])
def test_a_generation_leg_whose_kv_state_cannot_be_decoded_is_refused_with_the_transfer_error(tmp_path, monkeypatch,
                                                                                              state):
    with pytest.raises(TransferError) as info:
        decode_state(state)
    assert info.value.status == 400
    worker = _worker(tmp_path, monkeypatch, True)
    body = _leg("generation_only", ctx_request_id=3, first_gen_tokens=[5], encoded_opaque_state=state)
    assert _refusal(worker, body) == info.value.message
