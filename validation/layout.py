"""Payload geometry, in bytes: how a pool is cut into KV blocks, which fragments of a block a pair
moves, which pool blocks a request uses, and the keys its patterns derive from. Standard library only."""

from __future__ import annotations

import hashlib
import random

KV_NAMES = ("K", "V")


def ceil_to(multiple: int, value: int) -> int:
    return -(-int(value) // int(multiple)) * int(multiple)


def key_of(*parts) -> int:
    """A 64-bit key from (src, dst, round, op, length, kind, iteration ...)."""
    h = hashlib.blake2b("|".join(str(p) for p in parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def block_table(seed, pool_blocks: int, n: int) -> list:
    """n distinct pool blocks in a scattered order, as an engine's block table looks after a while."""
    if n > pool_blocks:
        raise ValueError(f"request needs {n} blocks, the pool has {pool_blocks}")
    return random.Random(str(seed)).sample(range(pool_blocks), n)


def side_layout(geom: dict, side: str, tpb: int) -> dict:
    """How one side's pool is cut into blocks and which fragments of a block a pair moves.

    A block holds tokens_per_block tokens of every layer, laid out [layer][K|V][token][heads x dim] as
    TensorRT-LLM's KV pool is. When both roles hold the same heads per rank ("block" mode) a block moves
    as one descriptor (TensorRT-LLM's head-match mapper); otherwise ("fragment" mode) every (layer, K|V)
    slice of a block is one descriptor of the heads both ranks share (head-mismatch mapper).
    Returns block_bytes, slot_bytes (one layer's K or V of one block) and frags [(offset, length)].
    """
    layers, kvf = int(geom["layers"]), int(geom["kv_factor"])
    slot_tok = int(geom["slot_bytes_per_token"][side])
    slot = tpb * slot_tok
    block = layers * kvf * slot
    if geom["mode"] == "block":
        frags = [(0, block)]
    else:
        flen = tpb * int(geom["frag_bytes_per_token"])
        frags = [((layer * kvf + k) * slot, flen) for layer in range(layers) for k in range(kvf)]
    return {"tpb": tpb, "block_bytes": block, "slot_bytes": slot, "frags": frags, "kv_factor": kvf,
            "layers": layers, "slot_bytes_per_token": slot_tok}


def describe_offset(lay: dict, offset: int) -> str:
    """'layer 3 V, token 5 of the block, byte 12' for a byte offset inside a block."""
    slot = lay["slot_bytes"]
    tpb = lay["tpb"]
    idx, within = divmod(offset, slot)
    layer, kv = divmod(idx, lay["kv_factor"])
    per_tok = max(1, slot // tpb)
    token, byte = divmod(within, per_tok)
    kv_name = KV_NAMES[kv] if lay["kv_factor"] == 2 else "latent"
    return f"layer {layer} {kv_name}, token {token} of the block, byte {byte} of that token's slice"
