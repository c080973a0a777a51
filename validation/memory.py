"""The one buffer each agent registers with NIXL: its role's KV pool (and, for a transceiver that stages, the
staging slices after it), in DRAM or VRAM, and every operation the pair runs on it.

Each pool fills blocks with a burst's pattern, checks received blocks, gathers a request's blocks into a staging
slice and scatters one back, flips a byte (the corrupt fault), and copies a region (the device-copy figure):

- ``DramPool``: numpy over the registered host memory itself;
- ``DevicePool``: VRAM through torch, or CuPy where torch is absent (a host buffer too, for the specs, with torch's
  CPU tensors). Patterns are generated and compared on the device: a check yields a count of bad words per slot,
  and only a slot (or block) that has one is copied to the host, to name the block and the byte. The pool is
  never copied whole to the host;
- ``HostMirrorPool``: VRAM from libcudart through ctypes when neither torch nor CuPy is there: fills and checks on a
  host mirror, copied to and from the device around them (the whole pool around a request's first and last burst).

Patterns: toolkit-free arithmetic of validation.pattern (the word at offset w of pool block b holds
key + b*A + w*B mod 2**64); on a device in signed 64-bit integers, whose wrapping sum and product have the same bits.
"""

from __future__ import annotations

import os
import sys
import time

try:
    import numpy as np
except ImportError:  # pragma: no cover - the agent reports it as a preflight failure
    np = None

from validation.pattern import A_MUL, B_MUL, MASK64, Mismatch, fill_blocks, verify_blocks, verify_untouched

DEVICE_CHUNK_BYTES = 64 << 20  # blocks per device operation: few kernel launches, bounded temporaries


def _signed(x: int) -> int:
    x &= MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


# -- moving a request's blocks to and from a staging slice (host memory, numpy) -----------------------------------

def gather_words(pool64, wl, blocks, out) -> None:
    """The moved words of ``blocks`` (in block order, fragments in order) into ``out`` (1-D uint64)."""
    view = wl.view(pool64)
    b = np.asarray(blocks, dtype=np.int64)
    if wl.full:
        np.take(view, b, axis=0, out=out.reshape(b.size, wl.bw))
    elif wl.stride:  # each layer's K and V at a fixed stride: strided copies, no index arrays
        frags = view.reshape(wl.nblocks, wl.nfrags, wl.stride)
        out.reshape(b.size, wl.nfrags, wl.fw)[...] = frags[b, :, :wl.fw]
    else:
        out.reshape(b.size, wl.pos.size)[...] = view[b[:, None], wl.pos[None, :]]


def scatter_words(pool64, wl, blocks, src) -> None:
    """The inverse of gather_words: ``src`` into the moved words of ``blocks``."""
    view = wl.view(pool64)
    b = np.asarray(blocks, dtype=np.int64)
    if wl.full:
        view[b] = src.reshape(b.size, wl.bw)
    elif wl.stride:
        view.reshape(wl.nblocks, wl.nfrags, wl.stride)[b, :, :wl.fw] = src.reshape(b.size, wl.nfrags, wl.fw)
    else:
        view[b[:, None], wl.pos[None, :]] = src.reshape(b.size, wl.pos.size)


def flat_pattern(word_off: int, n: int, key: int):
    """key + (word_off + i) * B for i < n: a flat region's pattern (the descriptor-size curve)."""
    w = np.arange(word_off, word_off + n, dtype=np.uint64)
    return w * np.uint64(B_MUL) + np.uint64(key & MASK64)


class DramPool:
    """Host memory (numpy), registered as is: fills, checks and copies work on it in place."""

    mem = "DRAM"
    how = "numpy"
    checks = "host (the registered memory itself)"
    checks_in_place = True  # a check copies nothing: the untouched blocks are checked after every burst

    def __init__(self, nbytes: int):
        self.host = np.zeros(nbytes // 8, dtype=np.uint64)
        self.addr = int(self.host.ctypes.data)
        self.nbytes = nbytes
        self.dev = 0
        self.pulled_bytes = 0  # what was copied from a device to the host for checks (none here)

    def sync(self) -> None:
        pass

    def fill(self, wl, blocks, key: int) -> None:
        fill_blocks(self.host, wl, blocks, key)

    def poison(self, wl, key: int) -> None:
        fill_blocks(self.host, wl, np.arange(wl.nblocks), key)

    def check_blocks(self, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, key_before=None) -> int:
        return verify_blocks(self.host, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, key_before)

    def check_untouched(self, wl, skip_blocks, key_stale: int) -> int:
        return verify_untouched(self.host, wl, skip_blocks, key_stale)

    def gather(self, wl, blocks, byte_off: int) -> float:
        t0 = time.perf_counter()
        n = len(blocks) * (wl.bw if wl.full else wl.pos.size)
        gather_words(self.host, wl, blocks, self.host[byte_off // 8: byte_off // 8 + n])
        return time.perf_counter() - t0

    def scatter(self, wl, blocks, byte_off: int) -> float:
        t0 = time.perf_counter()
        n = len(blocks) * (wl.bw if wl.full else wl.pos.size)
        scatter_words(self.host, wl, blocks, self.host[byte_off // 8: byte_off // 8 + n])
        return time.perf_counter() - t0

    def corrupt(self, byte_offset: int) -> None:
        self.host.view(np.uint8)[byte_offset] ^= 0x5A

    def fill_flat(self, word_off: int, n: int, key: int) -> None:
        self.host[word_off:word_off + n] = flat_pattern(word_off, n, key)

    def check_flat(self, word_off: int, n: int, key: int) -> int:
        """Bad words of a flat region against its pattern."""
        return int(np.count_nonzero(self.host[word_off:word_off + n] != flat_pattern(word_off, n, key)))

    def copy_seconds(self, src_off: int, dst_off: int, nbytes: int) -> float:
        """One copy of nbytes inside the pool (a host memcpy here): what a gather or scatter costs at best."""
        a, b, n = src_off // 8, dst_off // 8, nbytes // 8
        t0 = time.perf_counter()
        np.copyto(self.host[b:b + n], self.host[a:a + n])
        return time.perf_counter() - t0


# -- device memory: torch or CuPy ----------------------------------------------------------------------------------

class _Torch:
    name = "torch"

    def __init__(self, torch, device):
        self.t, self.device = torch, device

    def i64(self, values):
        return self.t.as_tensor(np.asarray(values, dtype=np.int64), device=self.device)

    def arange(self, n: int):
        return self.t.arange(n, dtype=self.t.int64, device=self.device)

    def words(self, u8):
        return u8.view(self.t.int64)

    def numpy_u64(self, x):
        return x.detach().cpu().numpy().view(np.uint64)

    def count(self, mask) -> int:
        return int(mask.sum())

    def first(self, mask) -> int:
        return int(self.t.argmax(mask.reshape(-1).to(self.t.uint8)))

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.t.cuda.synchronize(self.device)


class _Cupy:
    name = "cupy"

    def __init__(self, cp):
        self.cp = cp

    def i64(self, values):
        return self.cp.asarray(np.asarray(values, dtype=np.int64))

    def arange(self, n: int):
        return self.cp.arange(n, dtype=self.cp.int64)

    def words(self, u8):
        return u8.view(self.cp.int64)

    def numpy_u64(self, x):
        return self.cp.asnumpy(x).view(np.uint64)

    def count(self, mask) -> int:
        return int(mask.sum())

    def first(self, mask) -> int:
        return int(self.cp.argmax(mask.reshape(-1).astype(self.cp.uint8)))

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()


class DevicePool:
    """A pool in device memory (or, for specs, torch tensors in host memory) filled and checked where it lives."""

    checks = "device (patterns generated and compared there; a mismatching slot copied to the host to be named)"
    checks_in_place = True

    def __init__(self, ns, u8, addr: int, nbytes: int, dev: int, mem: str = "VRAM"):
        self.ns = ns
        self.u8 = u8
        self.w = ns.words(u8)
        self.addr, self.nbytes, self.dev, self.mem = addr, nbytes, dev, mem
        self.how = ns.name
        self.host = np.zeros(nbytes // 8, dtype=np.uint64)  # only mismatching slots are copied here
        self.pulled_bytes = 0
        self._layouts: dict = {}

    @classmethod
    def torch_vram(cls, nbytes: int, gpu: int):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device")
        torch.cuda.set_device(gpu)
        u8 = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}")
        return cls(_Torch(torch, u8.device), u8, int(u8.data_ptr()), nbytes, gpu)

    @classmethod
    def cupy_vram(cls, nbytes: int, gpu: int):
        import cupy

        cupy.cuda.Device(gpu).use()
        u8 = cupy.zeros(nbytes, dtype=cupy.uint8)
        return cls(_Cupy(cupy), u8, int(u8.data.ptr), nbytes, gpu)

    @classmethod
    def torch_host(cls, nbytes: int):
        """torch tensors over host memory: the device path, run on a CPU (specs; a DRAM pool registers as DRAM)."""
        import torch

        u8 = torch.zeros(nbytes, dtype=torch.uint8)
        return cls(_Torch(torch, u8.device), u8, int(u8.data_ptr()), nbytes, 0, mem="DRAM")

    def sync(self) -> None:
        self.ns.sync()

    def _dev(self, wl):
        """Per layout: word offsets times B, moved positions and their offsets times B, on the device."""
        k = id(wl)
        if k not in self._layouts:
            ns = self.ns
            words_b = ns.arange(wl.bw) * _signed(B_MUL)
            pos = ns.i64(wl.pos)
            self._layouts[k] = (wl, words_b, pos, pos * _signed(B_MUL),
                                max(1, DEVICE_CHUNK_BYTES // wl.lay["block_bytes"]))
        return self._layouts[k][1:]

    def _view(self, wl):
        return self.w[: wl.nblocks * wl.bw].reshape(wl.nblocks, wl.bw)

    def _rows(self, wl, blocks_t, key: int):
        words_b = self._dev(wl)[0]
        return (blocks_t * _signed(A_MUL) + _signed(key))[:, None] + words_b[None, :]

    def fill(self, wl, blocks, key: int) -> None:
        view, chunk = self._view(wl), self._dev(wl)[3]
        b = np.asarray(blocks, dtype=np.int64)
        for i in range(0, b.size, chunk):
            cb = self.ns.i64(b[i:i + chunk])
            view[cb] = self._rows(wl, cb, key)
        self.sync()

    def poison(self, wl, key: int) -> None:
        self.fill(wl, np.arange(wl.nblocks), key)

    def _pull(self, wl, blocks) -> None:
        """Copy these blocks (only) to the host mirror, to name what went wrong there."""
        view = self._view(wl)
        host = wl.view(self.host)
        b = np.asarray(blocks, dtype=np.int64)
        host[b] = self.ns.numpy_u64(view[self.ns.i64(b)])
        self.pulled_bytes += b.size * wl.bw * 8

    def check_blocks(self, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, key_before=None) -> int:
        """Every word of the destination blocks against the expected pattern, compared on the device: the moved
        positions hold the source's pattern, the rest the destination's stale one. A mismatch copies these blocks
        (one slot) to the host, where verify_blocks names the block and the byte."""
        view = self._view(wl_dst)
        _, pos, _, chunk = self._dev(wl_dst)
        src_pos_b = self._dev(wl_src)[2]
        bd = np.asarray(dst_blocks, dtype=np.int64)
        bs = np.asarray(src_blocks, dtype=np.int64)
        bad = 0
        for i in range(0, bd.size, chunk):
            cd, cs = self.ns.i64(bd[i:i + chunk]), self.ns.i64(bs[i:i + chunk])
            got = view[cd]
            moved = (cs * _signed(A_MUL) + _signed(key_src))[:, None] + src_pos_b[None, :]
            if wl_dst.full:
                exp = moved
            else:
                exp = self._rows(wl_dst, cd, key_stale)
                exp[:, pos] = moved
            bad += self.ns.count(got != exp)
        if bad:
            self._pull(wl_dst, bd)
            verify_blocks(self.host, wl_dst, bd, wl_src, bs, key_src, key_stale, key_before)  # raises Mismatch
            raise Mismatch({"request_block": 0, "pool_block": int(bd[0]), "word": 0, "offset": 0, "expected": "?",
                            "got": "?", "stale": False, "bad_words": bad, "where": "the device and host views differ"})
        return bd.size * wl_dst.bw * 8

    def check_untouched(self, wl, skip_blocks, key_stale: int) -> int:
        """Blocks no transfer may touch still hold the stale pattern: compared on the device; the first bad block
        is named from its words alone."""
        view, chunk = self._view(wl), self._dev(wl)[3]
        skip = np.zeros(wl.nblocks, dtype=bool)
        skip[np.asarray(skip_blocks, dtype=np.int64)] = True
        rest = np.flatnonzero(~skip)
        checked, bad, first = 0, 0, None
        for i in range(0, rest.size, chunk):
            cb_np = rest[i:i + chunk]
            cb = self.ns.i64(cb_np)
            neq = view[cb] != self._rows(wl, cb, key_stale)
            n = self.ns.count(neq)
            checked += cb_np.size * wl.bw * 8
            if n:
                bad += n
                if first is None:
                    flat = self.ns.first(neq)
                    j, w = divmod(flat, wl.bw)
                    first = (int(cb_np[j]), w)
        if first is not None:
            blk, w = first
            self._pull(wl, [blk])
            got = int(wl.view(self.host)[blk, w])
            exp = (key_stale + blk * A_MUL + w * B_MUL) & MASK64
            raise Mismatch({"request_block": None, "pool_block": blk, "word": w, "offset": w * 8,
                            "expected": f"{exp:#018x}", "got": f"{got:#018x}", "stale": False, "bad_words": bad,
                            "where": "a block outside the request (it must stay untouched)"})
        return checked

    def _staging(self, wl, n_blocks: int, byte_off: int):
        width = wl.bw if wl.full else wl.pos.size
        return self.w[byte_off // 8: byte_off // 8 + n_blocks * width].reshape(n_blocks, width)

    def gather(self, wl, blocks, byte_off: int) -> float:
        view, pos = self._view(wl), self._dev(wl)[1]
        t0 = time.perf_counter()
        b = self.ns.i64(blocks)
        out = self._staging(wl, len(blocks), byte_off)
        if wl.full:
            out[...] = view[b]
        elif wl.stride:  # each layer's K and V at a fixed stride: one strided copy
            out.reshape(len(blocks), wl.nfrags, wl.fw)[...] = \
                view.reshape(wl.nblocks, wl.nfrags, wl.stride)[b, :, :wl.fw]
        else:
            out[...] = view[b[:, None], pos[None, :]]
        self.sync()
        return time.perf_counter() - t0

    def scatter(self, wl, blocks, byte_off: int) -> float:
        view, pos = self._view(wl), self._dev(wl)[1]
        t0 = time.perf_counter()
        b = self.ns.i64(blocks)
        src = self._staging(wl, len(blocks), byte_off)
        if wl.full:
            view[b] = src
        elif wl.stride:
            view.reshape(wl.nblocks, wl.nfrags, wl.stride)[b, :, :wl.fw] = src.reshape(len(blocks), wl.nfrags, wl.fw)
        else:
            view[b[:, None], pos[None, :]] = src
        self.sync()
        return time.perf_counter() - t0

    def corrupt(self, byte_offset: int) -> None:
        self.u8[byte_offset] = self.u8[byte_offset] ^ 0x5A
        self.sync()

    def _flat(self, word_off: int, n: int, key: int):
        return (self.ns.arange(n) + word_off) * _signed(B_MUL) + _signed(key)

    def fill_flat(self, word_off: int, n: int, key: int) -> None:
        self.w[word_off:word_off + n] = self._flat(word_off, n, key)
        self.sync()

    def check_flat(self, word_off: int, n: int, key: int) -> int:
        return self.ns.count(self.w[word_off:word_off + n] != self._flat(word_off, n, key))

    def copy_seconds(self, src_off: int, dst_off: int, nbytes: int) -> float:
        a, b, n = src_off // 8, dst_off // 8, nbytes // 8
        self.sync()
        t0 = time.perf_counter()
        self.w[b:b + n] = self.w[a:a + n]
        self.sync()
        return time.perf_counter() - t0


# -- VRAM without torch or CuPy: libcudart and a host mirror ----------------------------------------------------

class HostMirrorPool(DramPool):
    """Device memory from libcudart (ctypes) with a host mirror: patterns are filled and checked on the host and
    copied around each burst (blocks, or the whole pool where a check needs it). The fallback where the node has
    neither torch nor CuPy; the report names it."""

    mem = "VRAM"
    how = "libcudart"
    checks = "host mirror (neither torch nor CuPy: the pool is copied to the host around checks)"
    checks_in_place = False  # the whole pool is copied for the untouched check: after a request's first and last burst

    def __init__(self, nbytes: int, gpu: int):
        import ctypes

        self.nbytes = nbytes
        self.dev = gpu
        self.host = np.zeros(nbytes // 8, dtype=np.uint64)
        self.pulled_bytes = 0
        self._ct = ctypes
        self._rt = _cudart()
        err = self._rt.cudaSetDevice(gpu)
        if err:
            raise RuntimeError(f"cudaSetDevice({gpu}) failed with CUDA error {err}")
        ptr = ctypes.c_void_p()
        err = self._rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        if err:
            raise RuntimeError(f"cudaMalloc({nbytes}) failed with CUDA error {err}")
        self.addr = int(ptr.value)

    def _copy(self, offset: int, n: int, to_device: bool) -> None:
        ct = self._ct
        host = int(self.host.ctypes.data) + offset
        dev = self.addr + offset
        dst, src, kind = (dev, host, 1) if to_device else (host, dev, 2)  # cudaMemcpyHostToDevice / DeviceToHost
        err = self._rt.cudaMemcpy(ct.c_void_p(dst), ct.c_void_p(src), ct.c_size_t(n), kind)
        if err:
            raise RuntimeError(f"cudaMemcpy failed with CUDA error {err}")
        if not to_device:
            self.pulled_bytes += n

    def _blocks(self, wl, blocks, to_device: bool) -> None:
        bb = wl.lay["block_bytes"]
        if blocks is None:
            self._copy(0, wl.nblocks * bb, to_device)
        else:
            for b in blocks:
                self._copy(int(b) * bb, bb, to_device)

    def fill(self, wl, blocks, key: int) -> None:
        super().fill(wl, blocks, key)
        self._blocks(wl, blocks, True)

    def poison(self, wl, key: int) -> None:
        super().poison(wl, key)
        self._blocks(wl, None, True)

    def check_blocks(self, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, key_before=None) -> int:
        self._blocks(wl_dst, dst_blocks, False)
        return super().check_blocks(wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, key_before)

    def check_untouched(self, wl, skip_blocks, key_stale: int) -> int:
        self._blocks(wl, None, False)
        return super().check_untouched(wl, skip_blocks, key_stale)

    def gather(self, wl, blocks, byte_off: int) -> float:
        t0 = time.perf_counter()
        self._blocks(wl, blocks, False)
        super().gather(wl, blocks, byte_off)
        n = len(blocks) * (wl.bw if wl.full else wl.pos.size) * 8
        self._copy(byte_off, n, True)
        return time.perf_counter() - t0

    def scatter(self, wl, blocks, byte_off: int) -> float:
        t0 = time.perf_counter()
        n = len(blocks) * (wl.bw if wl.full else wl.pos.size) * 8
        self._copy(byte_off, n, False)
        self._blocks(wl, blocks, False)
        super().scatter(wl, blocks, byte_off)
        self._blocks(wl, blocks, True)
        return time.perf_counter() - t0

    def corrupt(self, byte_offset: int) -> None:
        start = byte_offset // 8 * 8
        self._copy(start, 8, False)
        super().corrupt(byte_offset)
        self._copy(start, 8, True)

    def fill_flat(self, word_off: int, n: int, key: int) -> None:
        super().fill_flat(word_off, n, key)
        self._copy(word_off * 8, n * 8, True)

    def check_flat(self, word_off: int, n: int, key: int) -> int:
        self._copy(word_off * 8, n * 8, False)
        return super().check_flat(word_off, n, key)

    def copy_seconds(self, src_off: int, dst_off: int, nbytes: int) -> float:
        ct = self._ct
        t0 = time.perf_counter()
        err = self._rt.cudaMemcpy(ct.c_void_p(self.addr + dst_off), ct.c_void_p(self.addr + src_off),
                                  ct.c_size_t(nbytes), 3)  # cudaMemcpyDeviceToDevice
        if err:
            raise RuntimeError(f"cudaMemcpy failed with CUDA error {err}")
        self._rt.cudaDeviceSynchronize()
        return time.perf_counter() - t0


def vram_pool(nbytes: int, gpu: int):
    """A VRAM pool from torch, else CuPy, else libcudart (checks then go through a host mirror)."""
    errors = []
    for make in (DevicePool.torch_vram, DevicePool.cupy_vram):
        try:
            return make(nbytes, gpu)
        except Exception as exc:  # noqa: BLE001 - try the next allocator
            errors.append(f"{make.__name__}: {type(exc).__name__}: {exc}")
    try:
        return HostMirrorPool(nbytes, gpu)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"libcudart: {exc}")
        raise RuntimeError("; ".join(errors)) from None


def _cudart():
    import ctypes
    import glob

    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("no CUDA runtime (libcudart) found, and neither torch with CUDA nor CuPy is available")
