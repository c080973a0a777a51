"""Spec: payloads follow the recipe's KV geometry (blocks of tokens_per_block tokens, per tensor-parallel
rank, one descriptor per block, or per layer and K/V when the roles' heads differ), within the memory cap;
the verification catches stale, misplaced and corrupted data and names the block and the byte."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.helpers import BASE, plan_of
from toolkit.api import load_plan
from validation.layout import block_table, key_of, side_layout
from validation.pattern import Mismatch, WordLayout, fill_blocks, verify_blocks, verify_untouched
from toolkit.validate.params import Options, agents_for, build_params, geometry


def test_standin_geometry_is_one_descriptor_per_block_per_rank():
    plan = load_plan("standin-1p1d-1.3", ())  # the Python transceiver: its mapper's lists
    g, lengths, notes = geometry(plan, Options())
    assert g["mode"] == "block" and notes == [] and g["staging"] is None
    assert g["transfer"]["layout"] == "per-block" and g["transfer"]["staged"] == [False] * len(lengths)
    assert g["bytes_per_token"] == plan.kv.ctx_bytes_per_token_per_rank == 2048
    assert g["descriptor_bytes"] == 32 * 2048  # tokens_per_block x bytes per token per rank
    assert lengths == [128, 512, 2048]  # short, typical (max/4), longest admitted (max_input + prefix)
    lay = side_layout(g, "ctx", 32)
    assert lay["frags"] == [(0, 32 * 2048)]


def test_a_1_2_recipe_moves_one_staged_descriptor_per_rank_pair_of_the_request_s_bytes():
    """TensorRT-LLM 1.2's C++ transceiver: each request gathered into a staging slice, one WRITE of one descriptor
    into the destination's slice, scattered there. The agents register the slices after the pool's blocks; no
    tokens_per_block sweep (the descriptor count does not depend on it)."""
    plan = load_plan("standin-2p2d", ())
    g, lengths, notes = geometry(plan, Options())
    assert g["transfer"]["runtime"] == "CPP" and g["transfer"]["layout"] == "staged-per-rank-pair"
    assert g["transfer"]["staged"] == [True, True, True] and g["sweep_tokens_per_block"] == []
    assert any("sweep skipped: the C++ transceiver moves one descriptor per rank pair" in n for n in notes)
    st = g["staging"]
    assert st["slice_bytes"] == 1024 * 2048 and st["offset"] == g["blocks_bytes"] and st["recv_slices"] == g["slots"]
    assert g["pool_bytes"]["ctx"] == g["blocks_bytes"]["ctx"] + (1 + g["slots"]) * st["slice_bytes"]
    from validation.pair import Request

    wl = WordLayout(side_layout(g, "ctx", 32), g["blocks_bytes"]["ctx"])
    req = Request("r", 0, "node0", "node1", "forward", "WF", 2, 1024, 32, 10, 2, 12, wl, wl, staging=st)
    assert (req.entry["descriptors"], req.entry["bytes"]) == (1, 1024 * 2048)  # the request's bytes, one descriptor
    assert req.local_remote("WRITE")[0][0] == [0] and req.local_remote("WRITE")[1][3] == [4]


def test_a_1_3_recipe_on_the_python_runtime_moves_the_mapper_s_lists():
    """1.3.0rc27's default transceiver_runtime auto picks the Python transceiver on NIXL; context TP1 -> generation
    TP2 differ in heads: one descriptor per block x layer x K/V (HeadMismatchMapper)."""
    plan = plan_of(BASE.replace("Llama-3.3-70B", "Llama-3.1-8B"), "trtllm_version=1.3.0rc27", "generation.tp=2",
                   "traffic.max_input_len=2048")
    g, lengths, _ = geometry(plan, Options(max_memory_mb=4096))
    assert (g["transfer"]["runtime"], g["transfer"]["layout"]) == ("PYTHON", "head-mismatch")
    assert g["staging"] is None and not any(g["transfer"]["staged"])
    assert g["descriptors_per_block"] == 32 * 2 and g["descriptor_bytes"] == 32 * 4 * 128 * 2  # 4 shared heads


def test_read_is_not_run_unless_asked(tmp_path):
    """TensorRT-LLM never READs: the agents run WRITE only; --read adds READ, labelled as not TensorRT-LLM's."""
    plan = load_plan("standin-2p2d", ())
    assert build_params(plan, Options(mode="local"), str(tmp_path))["ops"] == ["WRITE"]
    p = build_params(load_plan("standin-1p1d-1.3", ()), Options(mode="local"), str(tmp_path))
    assert p["ops"] == ["WRITE"] and p["sweep"]["ops"] == ["WRITE"]
    asked = build_params(plan, Options(mode="local", read=True), str(tmp_path))
    assert asked["ops"] == ["WRITE", "READ"]
    from types import SimpleNamespace

    from validation.pair import PairRunner

    agent = SimpleNamespace(p={**p, "geometry": p["geometry"]}, id="node0", result={}, pool=None, faults=None,
                            gone={}, log=print, save=None, transfer_timeout=1.0, pair_timeout=1.0)
    assert [op for op, _ in PairRunner(agent, None, None).ops()] == ["WRITE"]


def test_tp_mismatch_moves_each_layer_and_kv_slice_of_the_shared_heads():
    plan = load_plan("llama-3.3-70b-h100", ())  # context TP4 (2 KV heads/rank), generation TP8 (1)
    g, lengths, notes = geometry(plan, Options(max_memory_mb=4096))
    assert g["mode"] == "fragment" and g["layers"] == 80
    assert 1 <= g["slots"] < 12
    assert [n for n in notes if "slot" not in n and "bursts" not in n and "sweep skipped" not in n] == []
    e = plan.kv.bytes_per_element
    assert g["slot_bytes_per_token"] == {"ctx": 2 * 128 * e, "gen": 1 * 128 * e}
    assert g["bytes_per_token"] == min(plan.kv.ctx_bytes_per_token_per_rank, plan.kv.gen_bytes_per_token_per_rank)
    ctx, gen = side_layout(g, "ctx", 32), side_layout(g, "gen", 32)
    assert len(ctx["frags"]) == len(gen["frags"]) == 80 * 2
    assert {n for _, n in ctx["frags"]} == {n for _, n in gen["frags"]} == {32 * 128 * e}
    assert ctx["frags"][1][0] == 32 * 2 * 128 * e  # K of layer 0, then V: one context slot (2 heads) further
    assert lengths[-1] == plan.kv.largest_request_tokens


def test_mla_is_one_latent_per_layer_not_split_by_tp():
    plan = load_plan("deepseek-r1-gb200", ())
    g, _, _ = geometry(plan, Options(max_memory_mb=4096))
    assert g["mode"] == "block" and g["kv_factor"] == 1
    assert g["slot_bytes_per_token"]["ctx"] == (512 + 64) * plan.kv.bytes_per_element


def test_memory_cap_scales_layers_down_and_says_so():
    plan = load_plan("llama-3.3-70b-h100", ())
    g, _, notes = geometry(plan, Options(max_memory_mb=64))
    assert max(g["pool_bytes"].values()) <= 64 * 2**20
    assert 1 <= g["layers"] < 80 and g["layers_per_rank"] == 80
    assert any("layers scaled down from 80" in n for n in notes)
    assert g["slots"] == 1 and any("bursts of 1 transfer(s) instead of 12" in n for n in notes)  # slots go first


def test_one_slot_per_transfer_when_memory_allows():
    """A request's warm-up and timed transfers each get their own destination blocks: one burst, every check
    after the timed window (validation/pair.py)."""
    g, _, notes = geometry(load_plan("standin-2p2d", ()), Options(iterations=10, warmup=2))
    assert g["slots"] == 12 and [n for n in notes if "sweep skipped" not in n] == []
    assert max(g["pool_bytes"].values()) <= 256 * 2**20
    assert geometry(load_plan("standin-2p2d", ()), Options(iterations=30, warmup=2))[0]["slots"] == 16


def test_agents_one_per_node_and_role():
    plan = load_plan("standin-2p2d", ())
    assert [(a["id"], a["role"]) for a in agents_for(plan, Options(mode="slurm"))] == [
        ("node0", "ctx"), ("node1", "ctx"), ("node2", "gen"), ("node3", "gen")]
    shared = load_plan("qwen3-smoke", ())  # context and generation share node 0
    assert [a["id"] for a in agents_for(shared, Options())] == ["node0-ctx", "node0-gen"]
    local = agents_for(plan, Options(mode="local", nodes=6))
    assert [a["role"] for a in local] == ["ctx"] * 3 + ["gen"] * 3


def test_params_carry_the_role_env_and_the_schedule(tmp_path):
    plan = load_plan("standin-2p2d", ())
    p = build_params(plan, Options(mode="local"), str(tmp_path))
    assert p["env"]["ctx"]["UCX_TLS"] == plan.context.env["UCX_TLS"]
    assert p["memory"] == "dram"  # the stand-in serves from host memory
    assert len(p["rounds"]) == 2 and sum(len(r) for r in p["rounds"]) == 4


def test_custom_lengths_round_up_to_whole_blocks():
    plan = plan_of()
    _, lengths, _ = geometry(plan, Options(lengths=(1, 100, 33)))
    assert lengths == [32, 64, 128]


# --- pattern and verification ------------------------------------------------------------------

def _pools(mode="block"):
    if mode == "block":
        g = {"mode": "block", "kv_factor": 2, "layers": 3, "slot_bytes_per_token": {"ctx": 64, "gen": 64},
             "frag_bytes_per_token": 3 * 2 * 64}
    else:
        g = {"mode": "fragment", "kv_factor": 2, "layers": 3, "slot_bytes_per_token": {"ctx": 128, "gen": 64},
             "frag_bytes_per_token": 64}
    tpb = 16
    ls, ld = side_layout(g, "ctx", tpb), side_layout(g, "gen", tpb)
    nblocks = 20
    src = np.zeros(nblocks * ls["block_bytes"] // 8, dtype=np.uint64)
    dst = np.zeros(nblocks * ld["block_bytes"] // 8, dtype=np.uint64)
    return WordLayout(ls, src.nbytes), WordLayout(ld, dst.nbytes), src, dst


def _transfer(wl_src, wl_dst, src, dst, bs, bd):
    """What NIXL does: fragment i of src block bs[j] lands in fragment i of dst block bd[j]."""
    s8, d8 = src.view(np.uint8), dst.view(np.uint8)
    for a, b in zip(bs, bd):
        for (so, n), (do, _) in zip(wl_src.lay["frags"], wl_dst.lay["frags"]):
            sa = a * wl_src.lay["block_bytes"] + so
            da = b * wl_dst.lay["block_bytes"] + do
            d8[da:da + n] = s8[sa:sa + n]


@pytest.mark.parametrize("mode", ["block", "fragment"])
def test_a_correct_transfer_verifies_every_byte(mode):
    wl_s, wl_d, src, dst = _pools(mode)
    bs, bd = block_table("s", wl_s.nblocks, 6), block_table("d", wl_d.nblocks, 6)
    k_src, k_stale = key_of("src"), key_of("stale")
    fill_blocks(src, wl_s, bs, k_src)
    fill_blocks(dst, wl_d, np.arange(wl_d.nblocks), k_stale)
    _transfer(wl_s, wl_d, src, dst, bs, bd)
    assert verify_blocks(dst, wl_d, bd, wl_s, bs, k_src, k_stale) == 6 * wl_d.lay["block_bytes"]
    assert verify_untouched(dst, wl_d, bd, k_stale) == 14 * wl_d.lay["block_bytes"]


def test_requests_spanning_several_check_chunks_of_unequal_block_sizes_verify():
    """Blocks of ~200-400 KiB: the check works a few blocks at a time (its scratch is sized per side), and
    the context side's chunks hold fewer blocks than the generation side's."""
    g = {"mode": "fragment", "kv_factor": 2, "layers": 3, "slot_bytes_per_token": {"ctx": 4096, "gen": 2048},
         "frag_bytes_per_token": 2048}
    ls, ld = side_layout(g, "ctx", 16), side_layout(g, "gen", 16)
    src = np.zeros(20 * ls["block_bytes"] // 8, dtype=np.uint64)
    dst = np.zeros(20 * ld["block_bytes"] // 8, dtype=np.uint64)
    wl_s, wl_d = WordLayout(ls, src.nbytes), WordLayout(ld, dst.nbytes)
    assert wl_s.chunk < wl_d.chunk < 11
    bs, bd = block_table("s", 20, 11), block_table("d", 20, 11)
    k_src, k_stale = key_of("src"), key_of("stale")
    for data_src, data_dst, wl_from, wl_to, b_from, b_to in ((src, dst, wl_s, wl_d, bs, bd),
                                                            (dst, src, wl_d, wl_s, bd, bs)):  # both directions
        fill_blocks(data_src, wl_from, b_from, k_src)
        fill_blocks(data_dst, wl_to, np.arange(20), k_stale)
        _transfer(wl_from, wl_to, data_src, data_dst, b_from, b_to)
        assert verify_blocks(data_dst, wl_to, b_to, wl_from, b_from, k_src, k_stale) == 11 * wl_to.lay["block_bytes"]
        assert verify_untouched(data_dst, wl_to, b_to, k_stale) == 9 * wl_to.lay["block_bytes"]
        data_dst.view(np.uint8)[b_to[7] * wl_to.lay["block_bytes"] + wl_to.lay["frags"][3][0] + 5] ^= 1
        with pytest.raises(Mismatch) as info:
            verify_blocks(data_dst, wl_to, b_to, wl_from, b_from, k_src, k_stale)
        assert info.value.detail["request_block"] == 7 and info.value.detail["where"].startswith("layer 1 V")


def test_a_transfer_that_did_not_happen_is_caught_as_stale():
    wl_s, wl_d, src, dst = _pools()
    bs, bd = [1, 2], [3, 4]
    fill_blocks(src, wl_s, bs, key_of("src"))
    fill_blocks(dst, wl_d, bd, key_of("stale"))
    with pytest.raises(Mismatch) as info:
        verify_blocks(dst, wl_d, bd, wl_s, bs, key_of("src"), key_of("stale"))
    assert info.value.detail["stale"] and info.value.detail["request_block"] == 0


def test_data_from_a_previous_iteration_does_not_pass():
    wl_s, wl_d, src, dst = _pools()
    bs, bd = [1, 2], [3, 4]
    fill_blocks(src, wl_s, bs, key_of("round", 0))
    _transfer(wl_s, wl_d, src, dst, bs, bd)  # last round's data is in place ...
    fill_blocks(src, wl_s, bs, key_of("round", 1))  # ... this round's source differs, and nothing moved
    with pytest.raises(Mismatch):
        verify_blocks(dst, wl_d, bd, wl_s, bs, key_of("round", 1), key_of("stale"))


@pytest.mark.parametrize("mode", ["block", "fragment"])
def test_a_later_burst_that_did_not_land_is_caught_without_poisoning_again(mode):
    """Burst b's slots still hold burst b-1's data (another source key): every moved word differs, and the
    mismatch says the destination still holds what it held before the transfer."""
    wl_s, wl_d, src, dst = _pools(mode)
    bs, bd = block_table("s", wl_s.nblocks, 5), block_table("d", wl_d.nblocks, 5)
    k_stale = key_of("stale")
    fill_blocks(dst, wl_d, np.arange(wl_d.nblocks), k_stale)
    fill_blocks(src, wl_s, bs, key_of("src", 0))
    _transfer(wl_s, wl_d, src, dst, bs, bd)  # burst 0
    assert verify_blocks(dst, wl_d, bd, wl_s, bs, key_of("src", 0), k_stale)
    fill_blocks(src, wl_s, bs, key_of("src", 1))  # burst 1's source; its transfer never happens
    with pytest.raises(Mismatch) as info:
        verify_blocks(dst, wl_d, bd, wl_s, bs, key_of("src", 1), k_stale, key_before=key_of("src", 0))
    d = info.value.detail
    assert d["stale"] and d["request_block"] == 0
    assert d["bad_words"] == 5 * wl_d.pos.size  # every moved word of every block, nothing else
    _transfer(wl_s, wl_d, src, dst, bs, bd)  # now it lands
    assert verify_blocks(dst, wl_d, bd, wl_s, bs, key_of("src", 1), k_stale, key_before=key_of("src", 0))


def test_a_block_landing_in_the_wrong_place_is_caught():
    wl_s, wl_d, src, dst = _pools()
    bs, bd = [1, 2, 5], [3, 4, 7]
    fill_blocks(src, wl_s, bs, key_of("src"))
    fill_blocks(dst, wl_d, np.arange(wl_d.nblocks), key_of("stale"))
    _transfer(wl_s, wl_d, src, dst, [1, 5, 2], bd)  # blocks 1 and 2 swapped in flight
    with pytest.raises(Mismatch) as info:
        verify_blocks(dst, wl_d, bd, wl_s, bs, key_of("src"), key_of("stale"))
    assert info.value.detail["request_block"] == 1 and info.value.detail["pool_block"] == 4


def test_corruption_names_the_block_and_the_first_bad_byte():
    wl_s, wl_d, src, dst = _pools("fragment")
    bs, bd = [0, 9, 3], [11, 2, 17]
    k_src, k_stale = key_of("src"), key_of("stale")
    fill_blocks(src, wl_s, bs, k_src)
    fill_blocks(dst, wl_d, np.arange(wl_d.nblocks), k_stale)
    _transfer(wl_s, wl_d, src, dst, bs, bd)
    slot = wl_d.lay["slot_bytes"]
    offset = 3 * slot + 100  # layer 1, V, inside the moved heads
    dst.view(np.uint8)[2 * wl_d.lay["block_bytes"] + offset] ^= 0xFF  # request block 1 = pool block 2
    with pytest.raises(Mismatch) as info:
        verify_blocks(dst, wl_d, bd, wl_s, bs, k_src, k_stale)
    d = info.value.detail
    assert (d["request_block"], d["pool_block"], d["offset"], d["bad_words"]) == (1, 2, offset, 1)
    assert d["where"].startswith("layer 1 V")


def test_a_write_outside_the_request_is_caught():
    _, wl_d, _, dst = _pools()
    fill_blocks(dst, wl_d, np.arange(wl_d.nblocks), key_of("stale"))
    dst.view(np.uint8)[5 * wl_d.lay["block_bytes"] + 8] ^= 1
    with pytest.raises(Mismatch) as info:
        verify_untouched(dst, wl_d, [1, 2], key_of("stale"))
    assert info.value.detail["pool_block"] == 5 and info.value.detail["request_block"] is None


def test_descriptor_lists_cover_every_fragment_of_the_pool():
    _, wl_d, _, _ = _pools("fragment")
    arr = wl_d.dlist(base=1 << 20, dev=0)
    assert arr.shape == (wl_d.nblocks * wl_d.nfrags, 3)
    assert set(arr[:, 1].tolist()) == {wl_d.lay["frags"][0][1]}
    idx = wl_d.desc_indices([2])
    assert int(arr[idx[0], 0]) == (1 << 20) + 2 * wl_d.lay["block_bytes"]


UCX_TABLES = """\
[1795371756.754499] [vm:14376:0]   +--------+-------------+-----------------------------------+
[1795371756.754499] [vm:14376:0]   | tkv-1-node0 self cfg#0                                   |
[1795371756.754499] [vm:14376:0]   | remote memory write by ucp_put* from host memory to host |
[1795371756.754499] [vm:14376:0]   +--------+-------------+-----------------------------------+
[1795371756.754499] [vm:14376:0]   | 0..inf | zero-copy   | cma/memory                        |
[1795371756.769735] [vm:14376:0]   | tkv-1-node0 inter-node cfg#1                             |
[1795371756.769735] [vm:14376:0]   | remote memory write by ucp_put* from host memory to host |
[1795371756.769735] [vm:14376:0]   +--------+-------------+-----------------------------------+
[1795371756.769735] [vm:14376:0]   | 0..inf | zero-copy   | tcp/eth0                          |
[1795371756.770259] [vm:14376:0]   | tkv-1-node0 inter-node cfg#1                    |
[1795371756.770259] [vm:14376:0]   | active message by ucp_am_send* from host memory |
[1795371756.770259] [vm:14376:0]   |   1..16515 | zero-copy          | tcp/eth0      |
[1795371756.931733] [vm:14376:0]   | tkv-1-node0 inter-node cfg#2                                    |
[1795371756.931733] [vm:14376:0]   | remote memory read by ucp_get* from host memory to host         |
[1795371756.931733] [vm:14376:0]   | 0..inf | zero-copy   | rc_mlx5/mlx5_0:1 50% + rc_mlx5/mlx5_1:1 50% |
"""


def test_ucx_protocol_tables_give_the_rma_transport_per_scope():
    from validation.probes import parse_ucx_proto_info

    tables = parse_ucx_proto_info(UCX_TABLES)
    assert [(t["scope"], t["operation"].split(" by ")[0], t["transports"]) for t in tables] == [
        ("self", "remote memory write", ["cma/memory"]),
        ("inter-node", "remote memory write", ["tcp/eth0"]),  # a TCP fallback the RDMA profiles fail on
        ("inter-node", "remote memory read", ["rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1"]),
    ]


# UCX 1.19 as NIXL 1.5 bundles it prints the title and the operation on one line (as gpu-findings-4 recorded on an H100)
UCX_CUDA_TABLES = """\
[1795841642.1] [gpu:5:0]   | ucp_context_0 intra-node cfg#2 | remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[1] |
[1795841642.1] [gpu:5:0]   +--------------------------------+---------------------------+---------------+
[1795841642.1] [gpu:5:0]   |                          Range | Description               | Config        |
[1795841642.1] [gpu:5:0]   |                         0..inf | {write}                   | {tl}          |
[1795841642.2] [gpu:5:0]   | ucp_context_0 intra-node cfg#2 | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
[1795841642.2] [gpu:5:0]   |                         0..inf | software emulation        | tcp/lo        |
"""


def test_ucx_s_protocol_per_op_and_memory_type_is_read():
    from validation.probes import parse_ucx_proto_info, protocol_choices

    choices = protocol_choices(parse_ucx_proto_info(UCX_CUDA_TABLES.format(write="zero-copy", tl="cuda_ipc/cuda")))
    assert [(c["op"], c["memory"], c["protocols"], c["transports"], c["emulated"]) for c in choices] == [
        ("WRITE", ["cuda", "cuda"], ["zero-copy"], ["cuda_ipc/cuda"], False),
        ("READ", ["cuda", "cuda"], ["software emulation"], ["tcp/lo"], True)]
    old = protocol_choices(parse_ucx_proto_info(UCX_TABLES))  # the title and the operation on two lines
    assert ("WRITE", ["host", "host"], ["zero-copy"]) in [(c["op"], c["memory"], c["protocols"]) for c in old]


def test_a_cuda_write_by_software_emulation_fails_naming_cause_and_fix():
    """TensorRT-LLM WRITEs: its op of CUDA memory served through host memory is a finding; a READ so served is said
    and passes (TensorRT-LLM never READs)."""
    from validation.probes import parse_ucx_proto_info, protocol_choices, protocol_verdict

    ok = protocol_choices(parse_ucx_proto_info(UCX_CUDA_TABLES.format(write="zero-copy", tl="cuda_ipc/cuda")))
    status, detail = protocol_verdict(ok, "cuda_copy,cuda_ipc,sm,self,tcp")
    assert status == "pass" and "READ of CUDA memory is served by UCX's software emulation" in detail
    bad = protocol_choices(parse_ucx_proto_info(UCX_CUDA_TABLES.format(write="software emulation", tl="tcp/lo")))
    status, detail = protocol_verdict(bad, "cuda_copy,sm,self,tcp")
    assert status == "fail" and "software emulation" in detail
    assert "UCX_TLS=cuda_copy,sm,self,tcp lacks cuda_ipc" in detail and "fix: add cuda_ipc to UCX_TLS" in detail
    status, detail = protocol_verdict(bad, "cuda_copy,cuda_ipc,sm,self,tcp")  # the list is right: the memory is not
    assert status == "fail" and "VMM allocation" in detail and "kv_transfer.runtime: CPP" in detail
