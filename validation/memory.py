"""The one buffer each agent registers with NIXL: its role's KV pool, in DRAM or VRAM.

A VRAM pool keeps a host mirror: patterns are filled and checked on the host and copied to and from the
device around each transfer. The device memory comes from torch when it has CUDA, else from libcudart
through ctypes (no torch or cupy needed).
"""

from __future__ import annotations

import os
import sys

try:
    import numpy as np
except ImportError:  # pragma: no cover - the agent reports it as a preflight failure
    np = None


class DramPool:
    mem = "DRAM"
    how = "numpy"

    def __init__(self, nbytes: int):
        self.host = np.zeros(nbytes // 8, dtype=np.uint64)
        self.addr = int(self.host.ctypes.data)
        self.nbytes = nbytes
        self.dev = 0

    def push(self, wl, blocks):  # host is the registered memory
        pass

    def pull(self, wl, blocks):
        pass


class VramPool:
    """Device memory with a host mirror for filling and checking. torch when present, else libcudart."""

    mem = "VRAM"

    def __init__(self, nbytes: int, gpu: int):
        self.nbytes = nbytes
        self.dev = gpu
        self.host = np.zeros(nbytes // 8, dtype=np.uint64)
        self._torch = None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.set_device(gpu)
                self._dev_t = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}")
                self._host_t = torch.from_numpy(self.host.view(np.uint8))
                self._torch = torch
                self.addr = int(self._dev_t.data_ptr())
                self.how = "torch"
                return
        except Exception:  # noqa: BLE001 - fall back to the CUDA runtime
            self._torch = None
        import ctypes

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
        self.how = "libcudart"

    def _copy(self, offset: int, n: int, to_device: bool) -> None:
        if self._torch is not None:
            if to_device:
                self._dev_t[offset:offset + n].copy_(self._host_t[offset:offset + n])
            else:
                self._host_t[offset:offset + n].copy_(self._dev_t[offset:offset + n])
            return
        ct = self._ct
        host = int(self.host.ctypes.data) + offset
        dev = self.addr + offset
        dst, src, kind = (dev, host, 1) if to_device else (host, dev, 2)  # cudaMemcpyHostToDevice / DeviceToHost
        err = self._rt.cudaMemcpy(ct.c_void_p(dst), ct.c_void_p(src), ct.c_size_t(n), kind)
        if err:
            raise RuntimeError(f"cudaMemcpy failed with CUDA error {err}")

    def _blocks(self, wl, blocks, to_device: bool) -> None:
        bb = wl.lay["block_bytes"]
        if blocks is None:
            self._copy(0, wl.nblocks * bb, to_device)
        else:
            for b in blocks:
                self._copy(int(b) * bb, bb, to_device)
        if self._torch is not None:
            self._torch.cuda.synchronize()

    def push(self, wl, blocks):
        self._blocks(wl, blocks, True)

    def pull(self, wl, blocks):
        self._blocks(wl, blocks, False)


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
    raise RuntimeError("no CUDA runtime (libcudart) found, and torch with CUDA is not available")
