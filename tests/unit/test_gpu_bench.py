"""Spec: the GPU benchmark (benchmarks/bench_transceiver_gpu.py) runs as docs/validate.md says on a device machine
whose one command is bounded (10 minutes): every wait it has ends inside the documented command's `timeout`, so its
figures are printed, never killed unseen; and scripts/device-wheels carries NIXL without what the validator never
loads."""

from __future__ import annotations

import importlib.util
import re
import zipfile
from importlib.machinery import SourceFileLoader

from tests.conftest import ROOT

DEVICE_COMMAND_LIMIT_S = 600  # the device tool stops one command at 10 minutes (docs/validate.md, "On a GPU")


def _load(path, name):
    """A script as a module (scripts/device-wheels has no .py suffix)."""
    loader = SourceFileLoader(name, str(ROOT / path))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(mod)
    return mod


def test_every_wait_of_the_documented_gpu_command_ends_inside_its_timeout():
    bench = _load("benchmarks/bench_transceiver_gpu.py", "bench_transceiver_gpu")
    doc = (ROOT / "docs" / "validate.md").read_text()
    section = doc[doc.index("## On a GPU: `benchmarks/bench_transceiver_gpu.py`"):]
    [timeout] = [int(t) for t in re.findall(r"timeout (\d+) python3 benchmarks/bench_transceiver_gpu\.py", section)]
    assert timeout < DEVICE_COMMAND_LIMIT_S
    args = bench.parser().parse_args(["--with-validate"])
    # the agents' own deadline, the coordinator's grace after it, then the 4-agent validation's bound
    assert bench.worst_case_s(args) < timeout


def test_device_wheels_trims_nixl_and_rewrites_its_record(tmp_path):
    dw = _load("scripts/device-wheels", "device_wheels")
    wheel = tmp_path / "nixl_cu13-1.5.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    members = ["nixl_cu13/_api.py", "nixl_ep_cu13/kernels.so", "nixl_cu13.libs/ucx/libucx_perftest_cuda.so",
               "nixl_cu13.libs/ucx/libuct_cuda.so"]
    record = "nixl_cu13-1.5.1.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as z:
        for m in members:
            z.writestr(m, b"x")
        z.writestr(record, "".join(f"{m},sha256=x,1\n" for m in members) + f"{record},,\n")
    out = tmp_path / "out.whl"
    total, kept = dw.trim(wheel, out)
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        listed = [ln.split(",", 1)[0] for ln in z.read(record).decode().splitlines() if ln]
    assert (total, kept) == (5, 3)
    assert sorted(names) == sorted(["nixl_cu13/_api.py", "nixl_cu13.libs/ucx/libuct_cuda.so", record])
    assert sorted(listed) == sorted(names)
