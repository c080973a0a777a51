"""Spec: launch.sbatch (and the orchestrator it starts, job.pyz) runs what the recipe says and nothing else, even with
hostile values.

The batch script is executed for real by bash, with stand-ins for srun/scontrol/scancel and for
the server command that record what they were given; the job's account is read from state/events.jsonl."""

import json
import socket
import subprocess
import time
from pathlib import Path

from tests.fakes.slurm import FAKE_SRUN, events, exe as _exe, fake_slurm_env, phases as _phases  # noqa: F401
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe_text
from toolkit.render import render

HOSTILE = """\
schema_version: 1
name: hostile
model: meta-llama/Llama-3.1-8B-Instruct
model_path: "/models/x; touch {marker}; $(touch {marker}) `touch {marker}`"
cluster:
  gpus_per_node: 2
  startup_timeout_s: 3
  container_mounts: ["/a:/b$(touch {marker})"]
  container_image: "img'; touch {marker}; '"
context:
  extra_serve_args: ["--log_level", "info; touch {marker}"]
  env:
    EVIL: "$(touch {marker})"
kv_transfer:
  transport: tcp
"""

FAKE_SERVER = r"""#!/bin/bash
python3 -c 'import json, os, sys; e = os.environ.get
print(json.dumps({"argv": sys.argv[1:], "EVIL": e("EVIL"), "UCX_TLS": e("UCX_TLS"),
                  "CUDA_VISIBLE_DEVICES": e("CUDA_VISIBLE_DEVICES"), "IPC_PORT": e("TLLM_SPAWN_PROXY_PROCESS_IPC_PORT")}))' \
    "$@" >> "$FAKE_LOG/server.jsonl"
exec sleep 60
"""


def _fake_slurm_env(tmp_path: Path, out: Path) -> dict:
    """PATH with recording stand-ins for srun/scontrol/scancel and the server, for a 2-node job."""
    env = fake_slurm_env(tmp_path, out)
    fake = tmp_path / "bin"
    _exe(fake / "trtllm-llmapi-launch", '#!/bin/bash\nexec "$@"\n')
    _exe(fake / "trtllm-serve", FAKE_SERVER)
    return env


def _events_text(out: Path) -> str:
    path = out / "state" / "events.jsonl"
    return path.read_text() if path.exists() else ""


def test_a_port_already_taken_on_a_node_fails_the_job_before_any_server_starts(tmp_path):
    # Something (an orphan of an earlier run, another deployment) listens on ctx-0's port: it would answer
    # this run's health checks, so the job must refuse to start rather than serve through it.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        text = HOSTILE.replace("/models/x; touch {marker}; $(touch {marker}) `touch {marker}`", "/models/x")
        text = text.replace("  startup_timeout_s: 3\n", f"  startup_timeout_s: 3\n  worker_base_port: {port}\n")
        text = text.format(marker=tmp_path / "unused")
        out, _ = render(build_plan(load_recipe_text(text, str(tmp_path / "r.yaml"))), tmp_path / "run")
        proc = subprocess.run(["bash", str(out / "launch.sbatch")], env=_fake_slurm_env(tmp_path, out),
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    phases = _phases(out)
    failed = [d for p, d in phases if p == "failed"]
    assert failed and f"port(s) {port} already in use on nodeA" in failed[0], phases
    assert "cluster.worker_base_port" in failed[0]
    assert "started" not in [p for p, _ in phases] and not (tmp_path / "server.jsonl").exists()
    assert "4242" in (tmp_path / "scancel.args").read_text()


def test_hostile_values_reach_the_server_as_data_not_as_commands(tmp_path):
    # Static urls: the workers start first (with membership the job starts the proxy first and waits for it; the
    # fake server does not answer, so the case below covers that order).
    marker = tmp_path / "PWNED"
    text = HOSTILE.format(marker=marker) + "membership:\n  enabled: false\n"
    loaded = load_recipe_text(text, str(tmp_path / "hostile.yaml"))
    out, _ = render(build_plan(loaded), tmp_path / "run")
    env = _fake_slurm_env(tmp_path, out)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(out / "launch.sbatch")], env=env, capture_output=True, text=True,
                          timeout=90)
    elapsed = time.monotonic() - start

    assert not marker.exists(), "a recipe value was executed as a command"
    # No server answers /health, so the job fails after startup_timeout_s and cancels itself.
    assert proc.returncode != 0
    assert elapsed < 60
    failed = [e for e in events(out) if e["event"] == "failed"]
    assert failed and "not healthy" in failed[0]["reason"] and failed[0]["component"] == "ctx-0", events(out)
    assert "4242" in (tmp_path / "scancel.args").read_text()

    servers = [json.loads(line) for line in (tmp_path / "server.jsonl").read_text().splitlines()]
    assert len(servers) == 2  # ctx-0 and gen-0 started, each exactly once
    for s in servers:
        assert s["argv"][0] == f"/models/x; touch {marker}; $(touch {marker}) `touch {marker}`"
        assert s["UCX_TLS"] == "tcp,cuda_copy,sm,self"
    ctx = next(s for s in servers if "8336" in s["argv"])
    assert ctx["EVIL"] == f"$(touch {marker})" and ctx["CUDA_VISIBLE_DEVICES"] == "0"
    assert ctx["argv"][-4:-2] == ["--log_level", f"info; touch {marker}"]
    srun_calls = [c.split("\0") for c in (tmp_path / "srun.args").read_text().split("\n") if c]
    images = [a for call in srun_calls for a in call if a.startswith("--container-image=")]
    assert images and all(a == "--container-image=img'; touch " + str(marker) + "; '" for a in images)
    # every process the job started is gone (a recorder may need a moment to finish its write)
    deadline = time.monotonic() + 5
    while True:
        left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left


# --- issue 15: internal ports per instance (W2), GPU request and extra Slurm arguments (W3), config check ---------

FOUR_ON_ONE_NODE = """\
schema_version: 1
name: packed
model: meta-llama/Llama-3.1-8B-Instruct
model_path: /models/x
membership: {enabled: false}  # static urls: the workers start first (the membership order has its own spec)
cluster:
  gpus_per_node: 4
  share_nodes: true
  startup_timeout_s: 3
  gpu_request: gpus-per-node
  exclusive: true
  sbatch_args: ["--constraint=h100", "--exclude=node9"]
  srun_args: ["--container-writable"]
context:
  instances: 2
generation:
  instances: 2
kv_transfer:
  transport: tcp
"""


def _run_sbatch(tmp_path, out, env=None, timeout=90):
    return subprocess.run(["bash", str(out / "launch.sbatch")], env=env or _fake_slurm_env(tmp_path, out),
                          capture_output=True, text=True, timeout=timeout)


def test_instances_on_one_node_get_distinct_internal_ports_and_the_gpu_request_and_extra_args(tmp_path):
    out, _ = render(build_plan(load_recipe_text(FOUR_ON_ONE_NODE, str(tmp_path / "r.yaml"))), tmp_path / "run")
    header = [line for line in (out / "launch.sbatch").read_text().splitlines() if line.startswith("#SBATCH")]
    for line in ("#SBATCH --gpus-per-node=4", "#SBATCH --exclusive", "#SBATCH --constraint=h100",
                 "#SBATCH --exclude=node9"):
        assert line in header
    assert not any("--gres" in line for line in header)
    _run_sbatch(tmp_path, out)
    servers = [json.loads(line) for line in (tmp_path / "server.jsonl").read_text().splitlines()]
    assert len(servers) == 4
    ports = sorted(int(s["IPC_PORT"]) for s in servers)
    assert ports == [9336, 9337, 9338, 9339], servers  # one each, allocated by the plan
    srun_calls = [c.split("\0") for c in (tmp_path / "srun.args").read_text().split("\n") if c]
    server_steps = [c for c in srun_calls if "--kill-on-bad-exit=1" in c]
    check_steps = [c for c in srun_calls if any(a.endswith("/check_config.py") for a in c)]
    # the 4 servers and the config check carry the recipe's srun arguments (the proxy never starts here: no
    # server turns healthy)
    assert len(server_steps) == 4 and len(check_steps) == 1
    assert all("--container-writable" in c for c in server_steps + check_steps)
    phases = _phases(out)
    names = [p for p, _ in phases]
    assert "check-skipped" in names and names.index("check-skipped") < names.index("started")
    assert any(p == "started" and "TLLM_SPAWN_PROXY_PROCESS_IPC_PORT=9337" in d for p, d in phases)


def test_an_internal_port_already_taken_fails_the_job_before_any_server_starts(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        text = FOUR_ON_ONE_NODE + f"  internal_base_port: {port}\n".replace("  ", "  ", 1)
        text = text.replace("  srun_args:", f"  internal_base_port: {port - 2}\n  srun_args:")
        text = text.replace(f"  internal_base_port: {port}\n", "")
        out, _ = render(build_plan(load_recipe_text(text, str(tmp_path / "r.yaml"))), tmp_path / "run")
        proc = _run_sbatch(tmp_path, out)
    assert proc.returncode != 0
    phases = _phases(out)
    assert any(p == "failed" and f"port(s) {port} already in use on nodeA" in d for p, d in phases), phases
    assert "started" not in [p for p, _ in phases] and not (tmp_path / "server.jsonl").exists()


def test_without_the_knob_co_located_launchers_start_one_after_another(tmp_path):
    # TensorRT-LLM 1.0: no TLLM_SPAWN_PROXY_PROCESS_IPC_PORT. Each next instance on the node waits until the
    # previous launcher has logged its IPC address and that port answers (here at once: a socket of this test).
    text = FOUR_ON_ONE_NODE.replace("name: packed\n", "name: packed\ntrtllm_version: \"1.0\"\n")
    out, _ = render(build_plan(load_recipe_text(text, str(tmp_path / "r.yaml"))), tmp_path / "run")
    env = _fake_slurm_env(tmp_path, out)
    with socket.socket() as leader:
        leader.bind(("127.0.0.1", 0))
        leader.listen()
        launcher = Path(env["PATH"].split(":")[0]) / "trtllm-llmapi-launch"
        _exe(launcher, "#!/bin/bash\nprintf '\\033[33mTLLM_SPAWN_PROXY_PROCESS_IPC_ADDR: tcp://127.0.0.1:%s\\033[0m\\n' "
             f"{leader.getsockname()[1]} >&2\nexec \"$@\"\n")
        start = time.monotonic()
        _run_sbatch(tmp_path, out, env)
        elapsed = time.monotonic() - start
    order = [(e["event"], e["component"]) for e in events(out) if e["event"] in ("waiting", "started")]
    assert order[:7] == [("started", "ctx-0"), ("waiting", "ctx-0"), ("started", "ctx-1"), ("waiting", "ctx-1"),
                         ("started", "gen-0"), ("waiting", "gen-0"), ("started", "gen-1")], order
    assert elapsed < 60  # nobody waited out the 120 s bound
    servers = [json.loads(line) for line in (tmp_path / "server.jsonl").read_text().splitlines()]
    assert len(servers) == 4 and all(s["IPC_PORT"] is None for s in servers)


def _free_ports() -> list[str]:
    """Overrides that move the recipe's ports to ones free now (other specs may be using the shipped ones)."""
    socks = [socket.socket() for _ in range(3)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        http, proxy, internal = (sock.getsockname()[1] for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    return [f"cluster.worker_base_port={min(http, 64000)}", f"proxy.port={proxy}",
            f"cluster.internal_base_port={min(internal, 64000)}"]


STANDIN_FAKE = r"""#!/bin/bash
if [ "${1:-}" = check-config ]; then exec python3 -m toolkit.standin "$@"; fi
echo "$*" >> "$FAKE_LOG/server.args"
exec sleep 60
"""


def test_a_bad_key_fails_the_job_at_the_config_check_before_any_server_starts(tmp_path):
    from toolkit.recipe import load_recipe
    from tests.conftest import ROOT
    plan = build_plan(load_recipe(str(ROOT / "recipes" / "standin-2p2d.yaml"),
                                  ["context.instances=1", "generation.instances=1", "cluster.startup_timeout_s=3",
                                   *_free_ports()]))
    out, _ = render(plan, tmp_path / "run")
    assert "--gres" not in (out / "launch.sbatch").read_text()  # stand-in recipes ask for no GPU
    with (out / "ctx.yaml").open("a") as f:  # a key this line's tables do not have (a file edited by hand)
        f.write("bogus_option: 1\n")
    env = _fake_slurm_env(tmp_path, out)
    _exe(Path(env["PATH"].split(":")[0]) / "tk-standin-serve", STANDIN_FAKE)
    env["PYTHONPATH"] = str(ROOT)
    proc = _run_sbatch(tmp_path, out, env)
    assert proc.returncode != 0
    phases = _phases(out)
    failed = [d for p, d in phases if p == "failed"]
    assert failed and failed[0].startswith("config check: ") and "ctx.yaml" in failed[0], phases
    assert "bogus_option" in failed[0] and "TensorRT-LLM 1.2" in failed[0]
    served = [line for line in ((tmp_path / "server.args").read_text().splitlines()
                                if (tmp_path / "server.args").exists() else []) if line != "--version"]
    assert "started" not in [p for p, _ in phases] and not served  # only provenance asked for the version


def test_the_config_check_passes_a_good_stand_in_deployment(tmp_path):
    from toolkit.recipe import load_recipe
    from tests.conftest import ROOT
    plan = build_plan(load_recipe(str(ROOT / "recipes" / "standin-2p2d.yaml"),
                                  ["context.instances=1", "generation.instances=1", "cluster.startup_timeout_s=3",
                                   *_free_ports()]))
    out, _ = render(plan, tmp_path / "run")
    env = _fake_slurm_env(tmp_path, out)
    _exe(Path(env["PATH"].split(":")[0]) / "tk-standin-serve", STANDIN_FAKE)
    env["PYTHONPATH"] = str(ROOT)
    _run_sbatch(tmp_path, out, env)
    phases = _phases(out)
    checked = [d for p, d in phases if p == "checked"]
    assert checked and "ctx.yaml, gen.yaml, disagg.resolved.yaml accepted" in checked[0], phases
    assert "started" in [p for p, _ in phases]


def test_with_membership_the_proxy_starts_first_and_a_silent_one_fails_the_job_naming_it(tmp_path):
    marker = tmp_path / "PWNED"
    loaded = load_recipe_text(HOSTILE.format(marker=marker), str(tmp_path / "hostile.yaml"))
    plan = build_plan(loaded)
    assert plan.membership is not None
    out, _ = render(plan, tmp_path / "run")
    proc = subprocess.run(["bash", str(out / "launch.sbatch")], env=_fake_slurm_env(tmp_path, out),
                          capture_output=True, text=True, timeout=90)
    assert not marker.exists(), "a recipe value was executed as a command"
    assert proc.returncode != 0
    started = [e["component"] for e in events(out) if e["event"] == "started"]
    assert started == ["proxy"], events(out)  # the proxy hosts the cluster storage: no worker before it answers
    failed = [e for e in events(out) if e["event"] == "failed"]
    assert failed and failed[0]["component"] == "proxy" and "proxy does not answer" in failed[0]["reason"]
    assert "4242" in (tmp_path / "scancel.args").read_text()
    argv = (tmp_path / "srun.args").read_text()
    assert "<node0>" not in argv, "every <nodeN> in a step's arguments is resolved"
