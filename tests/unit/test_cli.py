"""Spec: the command line. Errors exit 2 with no traceback; --json prints exactly one JSON document."""

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.unit.helpers import tk_in_process


def tk(*args, cwd=None):
    """tk in this process; the installed entry point itself: test_the_module_entry_point_runs_the_command_line."""
    return tk_in_process(*args, cwd=cwd)


def test_the_module_entry_point_runs_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "recipes", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["recipes"], proc.stderr


def test_help_does_not_import_heavy_modules():
    code = ("import sys; from toolkit.cli import main; rc = main(['--help']); "
            "heavy = [m for m in ('nixl', 'numpy', 'torch', 'pydantic', 'rich') if m in sys.modules]; "
            "print(heavy, file=sys.stderr); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_recipes_lists_every_shipped_recipe():
    proc = tk("recipes", "--json")
    names = {r["name"] for r in json.loads(proc.stdout)["recipes"]}
    assert names == {p.stem for p in (ROOT / "recipes").glob("*.yaml")}
    assert "standin-2p2d" in tk("recipes").stdout


def test_plan_json_has_the_derived_numbers():
    proc = tk("plan", str(ROOT / "recipes" / "llama-3.3-70b-h100.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["bytes_per_token"] == 163840
    assert doc["max_tokens_in_buffer"] == 8192
    assert doc["roles"]["generation"]["nodes"] == 1 and doc["roles"]["context"]["gpus"] == 8
    assert {"largest_request_transfer_ms", "largest_request_prefill_ms"} <= set(doc["estimates"])


def test_plan_prints_tables_to_stderr_and_nothing_to_stdout():
    proc = tk("plan", "standin-2p2d")
    assert proc.returncode == 0 and proc.stdout == ""
    assert "bytes per token" in proc.stderr and "stand-in" in proc.stderr


def test_bad_recipe_exits_2_names_file_line_field_and_writes_nothing(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("schema_version: 1\nname: b\nmodel: Qwen/Qwen3-0.6B\ncluster:\n  gpus_per_node: 8\n"
                      "kv_transfer:\n  max_tokens_in_buffer: lots\n  tokens_per_blok: 32\n")
    out = tmp_path / "out"
    proc = tk("render", str(recipe), "-o", str(out))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{recipe}:7: kv_transfer.max_tokens_in_buffer" in proc.stderr
    assert f"{recipe}:8: kv_transfer.tokens_per_blok" in proc.stderr and "did you mean" in proc.stderr
    assert not out.exists()
    # once the schema holds, the plan rules report against the same lines
    recipe.write_text(recipe.read_text().replace("lots", "100").replace("tokens_per_blok", "tokens_per_block"))
    proc = tk("render", str(recipe), "-o", str(out))
    assert proc.returncode == 2 and f"{recipe}:7: kv_transfer.max_tokens_in_buffer" in proc.stderr
    assert "not a multiple of tokens_per_block=32" in proc.stderr and not out.exists()


def test_errors_under_json_are_one_json_document(tmp_path):
    proc = tk("plan", str(tmp_path / "missing.yaml"), "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["errors"][0]["field"] == "(file)"


def test_render_with_set_and_json(tmp_path):
    proc = tk("render", "llama-3.3-70b-h100", "-o", str(tmp_path / "o"), "--set", "generation.instances=4", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "launch.sbatch" in doc["files"]
    assert "num_instances: 4" in (tmp_path / "o" / "disagg.yaml").read_text()


def test_render_check_uses_the_engines_own_parsers_or_says_it_skipped(tmp_path):
    # The stand-in's tables check a stand-in recipe; a TensorRT-LLM recipe is checked only where tensorrt_llm is
    # importable, and says so otherwise (exit 0 either way when nothing is refused).
    proc = tk("render", "standin-2p2d", "-o", str(tmp_path / "s"), "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    check = json.loads(proc.stdout)["check"]
    assert check["status"] == "ok" and "disagg.yaml accepted by the tk CPU stand-in" in check["message"]
    proc = tk("render", "qwen3-smoke", "-o", str(tmp_path / "q"), "--check")
    assert proc.returncode == 0, proc.stderr
    try:
        import tensorrt_llm  # noqa: F401
    except ImportError:
        assert "config NOT checked: tensorrt_llm is not importable" in proc.stderr


def test_render_check_fails_naming_the_file_and_key(tmp_path):
    from toolkit import api
    plan = api.load_plan("standin-2p2d", ())
    out, _ = api.render(plan, tmp_path / "s")
    with (out / "gen.yaml").open("a") as f:
        f.write("bogus_option: 1\n")
    status, message = api.check_config(plan, out)
    assert status == "failed" and "gen.yaml: " in message and "bogus_option" in message
