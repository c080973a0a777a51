"""Fill and verify patterns over a pool, vectorised with numpy (pools are viewed as uint64 words).

Pattern: the 64-bit word at word offset w of pool block b holds key + b*A + w*B (mod 2**64). A and B are
odd, so a word from another block, another offset or another key (an earlier round, iteration, request
or pair) differs, except with negligible probability.
"""

from __future__ import annotations

try:
    import numpy as np
except ImportError:  # pragma: no cover - the agent reports it as a preflight failure
    np = None

from validation.layout import describe_offset

A_MUL = 0x9E3779B97F4A7C15
B_MUL = 0xD6E8FEB86659FD93
MASK64 = (1 << 64) - 1
CHUNK_BYTES = 1 << 20  # verify in L2-sized pieces: small temporaries, little cache pollution


class WordLayout:
    """A side_layout in 64-bit words, with the arrays fill/verify need.

    Fill and verify work a chunk of blocks at a time in scratch arrays allocated once per layout: a
    check that allocated (and, for large temporaries, mmap'ed and unmapped) megabytes per transfer
    would disturb the next timed transfer (page faults, TLB shootdowns), measuring the checker rather
    than the link (benchmarks/bench_validate.py).
    """

    def __init__(self, lay: dict, pool_bytes: int):
        for name, v in (("block", lay["block_bytes"]), *((f"fragment {o}+{n}", o | n) for o, n in lay["frags"])):
            if v % 8:
                raise ValueError(f"{name} is not a multiple of 8 bytes")
        self.lay = lay
        self.bw = lay["block_bytes"] // 8
        self.nblocks = pool_bytes // lay["block_bytes"]
        self.frag_offsets = [o // 8 for o, _ in lay["frags"]]
        self.fw = lay["frags"][0][1] // 8
        self.nfrags = len(lay["frags"])
        self.words_b = np.arange(self.bw, dtype=np.uint64) * np.uint64(B_MUL)
        # word positions, inside a block, of the bytes a pair moves (fragment by fragment)
        self.pos = (np.asarray(self.frag_offsets, dtype=np.int64)[:, None]
                    + np.arange(self.fw, dtype=np.int64)[None, :]).ravel()
        self.pos_b = self.pos.astype(np.uint64) * np.uint64(B_MUL)
        self.full = self.nfrags == 1 and self.fw == self.bw
        # fragments at a fixed stride from the block's start (each layer's K, V): (stride in words) or None
        stride = self.frag_offsets[1] - self.frag_offsets[0] if self.nfrags > 1 else self.bw
        regular = (self.frag_offsets == [i * stride for i in range(self.nfrags)] and stride * self.nfrags == self.bw
                   and stride >= self.fw)
        self.stride = stride if regular else None
        self.chunk = max(1, CHUNK_BYTES // lay["block_bytes"])
        self._scratch = None

    def scratch(self):
        """(column, rows, got, neq, moved) work arrays for one chunk of blocks, allocated on first use."""
        if self._scratch is None:
            c = self.chunk
            rows = np.empty((c, self.bw), dtype=np.uint64)
            moved = rows if self.full else np.empty((c, self.pos.size), dtype=np.uint64)
            self._scratch = (np.empty(c, dtype=np.uint64), rows, np.empty((c, self.bw), dtype=np.uint64),
                             np.empty((c, self.bw), dtype=bool), moved)
        return self._scratch

    def view(self, pool64):
        return pool64[: self.nblocks * self.bw].reshape(self.nblocks, self.bw)

    def _block_keys(self, blocks, key):
        """key + b*A per block (mod 2**64), in the scratch column."""
        col = self.scratch()[0][: len(blocks)]
        np.multiply(np.asarray(blocks, dtype=np.uint64), np.uint64(A_MUL), out=col)
        np.add(col, np.uint64(key), out=col)
        return col

    def rows(self, blocks, key):
        """The pattern of key over whole blocks (at most one chunk), in scratch: valid until the next call."""
        out = self.scratch()[1][: len(blocks)]
        np.add(self._block_keys(blocks, key)[:, None], self.words_b[None, :], out=out)
        return out

    def moved_rows(self, blocks, key, source):
        """The pattern of key at the moved word positions of the source layout's blocks (at most one of
        this layout's chunks; both sides move the same number of words per block), in this layout's scratch."""
        out = self.scratch()[4][: len(blocks)]
        np.add(self._block_keys(blocks, key)[:, None], source.pos_b[None, :], out=out)
        return out

    def desc_indices(self, blocks):
        b = np.asarray(blocks, dtype=np.int64)
        return (b[:, None] * self.nfrags + np.arange(self.nfrags, dtype=np.int64)[None, :]).ravel()

    def dlist(self, base: int, dev: int):
        """Nx3 (addr, len, dev) for every fragment of every block of the pool."""
        starts = (np.arange(self.nblocks, dtype=np.uint64)[:, None] * np.uint64(self.lay["block_bytes"])
                  + np.asarray([o for o, _ in self.lay["frags"]], dtype=np.uint64)[None, :]).ravel()
        out = np.empty((starts.size, 3), dtype=np.uint64)
        out[:, 0] = starts + np.uint64(base)
        out[:, 1] = self.lay["frags"][0][1]
        out[:, 2] = dev
        return out


def fill_blocks(pool64, wl: WordLayout, blocks, key: int) -> None:
    """Fill whole blocks with the pattern of key."""
    view = wl.view(pool64)
    blocks = np.asarray(blocks, dtype=np.int64)
    for i in range(0, blocks.size, wl.chunk):
        cb = blocks[i:i + wl.chunk]
        view[cb] = wl.rows(cb, key)


class Mismatch(Exception):
    def __init__(self, detail: dict):
        self.detail = detail
        super().__init__(detail.get("message", "data mismatch"))


def _gather(view, blocks, wl: WordLayout):
    """The blocks' words, copied into scratch (np.take: no temporary array)."""
    return np.take(view, blocks, axis=0, out=wl.scratch()[2][: len(blocks)])


def verify_blocks(pool64, wl_dst: WordLayout, dst_blocks, wl_src: WordLayout, src_blocks,
                  key_src: int, key_stale: int, key_before: int | None = None) -> int:
    """Check every byte of the destination blocks of a request; return the bytes checked.

    The moved fragments must hold the source pattern of the matching source block and offset; the rest
    of each destination block must still hold the destination's own stale pattern. Raises Mismatch with
    the first bad block and byte and the count of bad words, and whether that word still holds what was
    there before the transfer: the stale pattern, or, given key_before, the source pattern of that key
    (an earlier burst's transfer into the same blocks).
    """
    view = wl_dst.view(pool64)
    bd = np.asarray(dst_blocks, dtype=np.int64)
    bs = np.asarray(src_blocks, dtype=np.int64)
    checked = 0
    first = None
    bad = 0
    for i in range(0, bd.size, wl_dst.chunk):
        cd, cs = bd[i:i + wl_dst.chunk], bs[i:i + wl_dst.chunk]
        got = _gather(view, cd, wl_dst)
        if wl_dst.full:
            exp = wl_dst.moved_rows(cs, key_src, wl_src)
        else:
            exp = wl_dst.rows(cd, key_stale)
            exp[:, wl_dst.pos] = wl_dst.moved_rows(cs, key_src, wl_src)
        neq = np.not_equal(got, exp, out=wl_dst.scratch()[3][: cd.size])
        checked += got.nbytes
        if neq.any():
            n = int(np.count_nonzero(neq))
            bad += n
            if first is None:
                flat = int(np.argmax(neq))
                j, w = divmod(flat, wl_dst.bw)
                e, g = int(exp[j, w]), int(got[j, w])
                x = e ^ g
                byte = (x & -x).bit_length() - 1
                stale = (key_stale + int(cd[j]) * A_MUL + w * B_MUL) & MASK64
                moved = np.flatnonzero(wl_dst.pos == w)
                if key_before is not None and moved.size:
                    stale = (key_before + int(cs[j]) * A_MUL + int(wl_src.pos[moved[0]]) * B_MUL) & MASK64
                first = {"request_block": i + j, "pool_block": int(cd[j]), "word": w,
                         "offset": w * 8 + byte // 8, "expected": f"{e:#018x}", "got": f"{g:#018x}",
                         "stale": g == stale}
    if first is not None:
        first["bad_words"] = bad
        first["where"] = describe_offset(wl_dst.lay, first["offset"])
        raise Mismatch(first)
    return checked


def verify_untouched(pool64, wl: WordLayout, skip_blocks, key_stale: int) -> int:
    """Blocks no transfer should touch must still hold the stale pattern; returns bytes checked."""
    view = wl.view(pool64)
    skip = np.zeros(wl.nblocks, dtype=bool)
    skip[np.asarray(skip_blocks, dtype=np.int64)] = True
    rest = np.flatnonzero(~skip)
    checked = 0
    for i in range(0, rest.size, wl.chunk):
        cb = rest[i:i + wl.chunk]
        got = _gather(view, cb, wl)
        exp = wl.rows(cb, key_stale)
        neq = np.not_equal(got, exp, out=wl.scratch()[3][: cb.size])
        checked += got.nbytes
        if neq.any():
            j, w = divmod(int(np.argmax(neq)), wl.bw)
            raise Mismatch({"request_block": None, "pool_block": int(cb[j]), "word": w, "offset": w * 8,
                            "expected": f"{int(exp[j, w]):#018x}",
                            "got": f"{int(got[j, w]):#018x}", "stale": False, "bad_words": int(neq.sum()),
                            "where": "a block outside the request (it must stay untouched)"})
    return checked
