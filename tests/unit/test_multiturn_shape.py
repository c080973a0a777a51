"""tk plan --turns / tk size --turns: what a multi-turn traffic shape recomputes on the context servers."""

from __future__ import annotations

import pytest

from toolkit.size.multiturn import MultiTurnShape, recompute


def test_each_way_prefills_what_the_shape_implies():
    doc = recompute(MultiTurnShape(turns=3, message=100, answer=20))
    t3 = doc["turns"][2]
    assert t3["prompt_tokens"] == 3 * 100 + 2 * 20
    assert t3["no_reuse"] == {"computed": 340, "recomputed": 240, "recomputed_answers": 40}
    assert t3["reuse"] == {"computed": 120, "recomputed": 20, "recomputed_answers": 20}
    assert t3["pullback"] == {"computed": 100, "recomputed": 0, "recomputed_answers": 0}
    tot = doc["totals"]
    assert tot["no_reuse"]["computed"] == 100 + 220 + 340 and tot["reuse"]["recomputed_answers"] == 40
    assert tot["reuse"]["recompute_share"] == round(40 / 340, 4) and tot["pullback"]["recompute_share"] == 0
    assert "3-turn conversation" in doc["summary"]


def test_times_follow_the_prefill_cost_and_the_bandwidth():
    doc = recompute(MultiTurnShape(2, 1000, 500), prefill_ms_per_token=0.04, kv_bytes_per_token=131072, gbps=50)
    t2 = doc["turns"][1]
    assert t2["reuse"]["prefill_ms"] == 60.0 and t2["pullback"]["prefill_ms"] == 40.0
    assert t2["pullback"]["transfer_ms"] == pytest.approx(500 * 131072 / 50e9 * 1e3, abs=1e-3)
    assert "transfer_ms" not in doc["turns"][0]["pullback"]


def test_shape_bounds():
    with pytest.raises(ValueError):
        MultiTurnShape(0, 10, 10)


def test_plan_shape_defaults_and_bound():
    from toolkit import api
    from toolkit.errors import TkError

    plan = api.load_plan("standin-multiturn")
    doc = api.multi_turn_share(plan, 4, answer_len=256)
    assert doc["shape"] == {"turns": 4, "message": (4096 - 3 * 256) // 4, "answer": 256}
    assert "plan's prefill estimate" in doc["inputs"]["prefill_source"] and doc["inputs"]["gbps"] == 3.125
    with pytest.raises(TkError, match="traffic.max_input_len"):
        api.multi_turn_share(plan, 4, answer_len=256, message_len=2000)
