"""Spec (property-based): whatever text a user gives — a recipe field, a `--set` value, the recipe's file
name, the output or run directory — nothing in it ever runs as a command. Every rendered batch script is
executed for real by bash under recording stand-ins for srun/scontrol/scancel and the server, every env
file is sourced the way the job sources it, and the validation batch script is executed too; a marker file
that any injected command would create must never appear. Loading either refuses with a RecipeError
(exit 2) or the render succeeds; no other exception, ever. (issue 9, class 1; the audit's bugs 1-3.)"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.errors import RecipeError, TkError
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe
from toolkit.render import render
from toolkit.validate import launchers
from toolkit.validate.params import Options, build_params

EXAMPLES = int(os.environ.get("TK_HOSTILE_EXAMPLES", "25"))

BASE = """\
schema_version: 1
name: hx
model: tk/standin-tiny
engine: standin
cluster:
  gpus_per_node: 1
  startup_timeout_s: 5
kv_transfer:
  transport: tcp
"""

# Ways a text could break out of where it lands: bash words and substitutions, env-file lines, comment
# lines, YAML keys, #SBATCH directives. {m} is `$TK_MARK` (no slash, so it fits in a file name); every
# command below runs with TK_MARK set to the marker's path.
PAYLOADS = ["\ntouch {m}\n", "$(touch {m})", "`touch {m}`", "; touch {m};", "' ; touch {m}; '",
            "\" ; touch {m}; \"", "\r\ntouch {m} #", "\u2028touch {m}", "\\\ntouch {m}", "\nx: $(touch {m})\n",
            "\n#SBATCH --wrap='touch {m}'\n", "${{IFS}}touch${{IFS}}{m}", "&& touch {m}", "| touch {m}"]
NOISE = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)

pytestmark = pytest.mark.slow


MARK = "$TK_MARK"


def hostile(marker: Path):
    return st.builds(lambda a, p, b: a + p.format(m=MARK) + b, NOISE, st.sampled_from(PAYLOADS), NOISE)


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory) -> Path:
    """srun runs its command (once per node for the node probe, as the local shim does); the server records
    nothing and exits at once, so the job fails fast after starting every step."""
    d = tmp_path_factory.mktemp("fakebin")
    _exe(d / "srun", r"""#!/bin/bash
nodelist=""
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do case "$1" in --nodelist=*) nodelist=1 ;; esac; shift; done
if [ -z "$nodelist" ] && [ "${4:-}" = tk-nodes ]; then
    for n in nodeA nodeB nodeC nodeD; do SLURMD_NODENAME=$n "$@"; done; exit 0
fi
exec "$@"
""")
    _exe(d / "scontrol", "#!/bin/bash\nprintf 'nodeA\\nnodeB\\nnodeC\\nnodeD\\n'\n")
    _exe(d / "scancel", "#!/bin/bash\nexit 0\n")
    _exe(d / "hostname", "#!/bin/bash\necho 127.0.0.1\n")
    for server in ("tk-standin-serve", "trtllm-serve", "trtllm-llmapi-launch"):
        _exe(d / server, "#!/bin/bash\nexit 3\n")
    return d


def _run(argv: list[str], cwd: Path, fake_bin: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(cwd), "SLURM_JOB_NODELIST": "node[A-D]",
           "SLURM_JOB_ID": "4242", "TK_MARK": str(_marker_of(cwd)), **(extra_env or {})}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def _marker_of(path: Path) -> Path:
    """The sandbox's marker: PWNED in the first directory up from path whose name starts with "sandbox"."""
    for p in (path, *path.parents):
        if p.name.startswith(("sandbox", "vsandbox", "test_every_payload")):
            return p / "PWNED"
    return path.parent / "PWNED"


def _execute_deployment(out: Path, fake_bin: Path) -> None:
    for env_file in sorted(out.glob("*.env")):
        _run(["bash", "-c", 'set -a; . "$1"; set +a', "source-env", str(env_file)], out, fake_bin)
    _run(["bash", str(out / "launch.sbatch")], out, fake_bin, {"TK_RUN_DIR": str(out)})


def _safe_file_name(text: str) -> str:
    name = text.replace("/", "_").replace("\0", "_")
    return (name or "r")[:150] + ".yaml"


FIELDS = ["model_path", "description", "context.model_path", "cluster.container_image", "context.env.EVIL",
          "kv_transfer.env.X", "context.extra_serve_args", "cluster.container_mounts", "quantization", "name",
          "cluster.partition", "cluster.account", "cluster.time_limit", "model", "cluster.sbatch_args",
          "cluster.srun_args"]
LIST_FIELDS = ("context.extra_serve_args", "cluster.container_mounts", "cluster.sbatch_args", "cluster.srun_args")


def _render_and_execute(sandbox: Path, fake_bin: Path, recipe_name: str, out_name: str, overrides: list[str]):
    """Render (or be refused) and execute what was rendered; the rendered directory, or None if refused."""
    recipe_file = sandbox / _safe_file_name(recipe_name)
    out = sandbox / _safe_file_name(out_name).removesuffix(".yaml")
    try:
        recipe_file.write_text(BASE)
    except OSError:
        return None  # a name the file system refuses (too long): nothing to render
    try:
        plan = build_plan(load_recipe(str(recipe_file), overrides))
        render(plan, out)
    except RecipeError:
        return None  # refused with file, line, field and fix (exit 2): nothing written
    except TkError as exc:
        assert "cannot" in str(exc) or "#SBATCH" in str(exc), exc  # a refusal that says why
        return None
    _execute_deployment(out, fake_bin)
    return out


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(data=st.data())
def test_no_recipe_file_name_or_output_directory_ever_runs(tmp_path_factory, fake_bin, data):
    sandbox = tmp_path_factory.mktemp("sandbox")
    marker = sandbox / "PWNED"
    names = hostile(marker)
    recipe_name, out_name = data.draw(names), data.draw(names)
    out = _render_and_execute(sandbox, fake_bin, recipe_name, out_name, [])
    assert out is not None, "a hostile file name is rendered, escaped (never refused)"
    assert not marker.exists(), f"file {recipe_name!r} / out {out_name!r} ran a command"


@SETTINGS
@given(data=st.data())
def test_no_field_or_set_value_ever_runs(tmp_path_factory, fake_bin, data):
    sandbox = tmp_path_factory.mktemp("sandbox")
    marker = sandbox / "PWNED"
    field, value = data.draw(st.sampled_from(FIELDS)), data.draw(hostile(marker))
    if field in LIST_FIELDS:
        overrides = [f"{field}={_yaml_list(value)}"]
    else:
        overrides = [f"{field}={_yaml_str(value)}"]
    _render_and_execute(sandbox, fake_bin, "r", "out", overrides)
    assert not marker.exists(), f"{field}={value!r} ran a command"


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_payload_in_the_recipe_file_name_stays_a_comment(tmp_path, fake_bin, payload):
    marker = tmp_path / "PWNED"
    out = _render_and_execute(tmp_path, fake_bin, "evil" + payload.format(m=MARK), "out", [])
    assert out is not None and not marker.exists()
    assert (out / "launch.sbatch").read_text().splitlines()[2].startswith("# Rendered by tk")


@SETTINGS
@given(data=st.data())
def test_no_validation_run_directory_ever_runs(tmp_path_factory, fake_bin, data):
    sandbox = tmp_path_factory.mktemp("vsandbox")
    marker = sandbox / "PWNED"
    run_dir = sandbox / _safe_file_name(data.draw(hostile(marker))).removesuffix(".yaml")
    recipe_file = sandbox / "r.yaml"
    recipe_file.write_text(BASE)
    plan = build_plan(load_recipe(str(recipe_file), []))
    try:
        run_dir.mkdir()
    except OSError:
        return
    (run_dir / "logs").mkdir()
    params = build_params(plan, Options(mode="slurm", iterations=1, sweep=False), str(run_dir))
    script = launchers.render_sbatch(plan, params, run_dir, "python3", [], "10")
    (run_dir / "validate.sbatch").write_text(script)
    _run(["bash", str(run_dir / "validate.sbatch")], run_dir, fake_bin, {"TK_RUN_DIR": str(run_dir)})
    assert not marker.exists(), f"run directory {run_dir.name!r} ran a command"
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert all(str(run_dir) not in line for line in header)


def _yaml_str(value: str) -> str:
    import json

    return json.dumps(value)  # JSON is YAML: a double-quoted scalar with escapes


def _yaml_list(value: str) -> str:
    import json

    return json.dumps(["--flag", value])
