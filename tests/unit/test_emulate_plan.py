"""Recipe `standin.emulate`: validated, refused outside the stand-in, rendered into the role env, named everywhere."""

from __future__ import annotations

from tests.unit.helpers import BASE, fields, plan_of, violations_of

STANDIN = """\
schema_version: 1
name: t
engine: standin
model: tk/standin-tiny
cluster:
  gpus_per_node: 2
  gpu: CPU
kv_transfer:
  transport: tcp
"""
EMULATE = ("standin.emulate.model=meta-llama/Llama-3.1-8B-Instruct", "standin.emulate.gpu=H100")


def test_emulation_reaches_both_roles_env_and_the_engine_label():
    plan = plan_of(STANDIN, *EMULATE)
    for role in (plan.context, plan.generation):
        assert role.env["TK_STANDIN_EMULATE_MODEL"] == "meta-llama/Llama-3.1-8B-Instruct"
        assert role.env["TK_STANDIN_EMULATE_GPU"] == "H100"
        assert role.env["TK_STANDIN_EMULATE_PRECISION"] == "bf16"
        assert role.env["TK_STANDIN_EMULATE_KV_GBPS"] == "3.125"  # the tcp profile's nominal GB/s
    assert "emulated timing of meta-llama/Llama-3.1-8B-Instruct on H100" in plan.engine.label
    assert plan.recipe["standin"]["emulate"]["gpu"] == "H100"


def test_no_emulation_no_env_and_no_section_in_the_manifest():
    plan = plan_of(STANDIN)
    assert not any(k.startswith("TK_STANDIN_EMULATE") for k in plan.generation.env)
    assert "emulated" not in plan.engine.label and "standin" not in plan.recipe


def test_emulation_is_refused_for_a_real_engine():
    v = violations_of(BASE, *EMULATE)
    assert "standin.emulate" in fields(v)
    assert any("runs for real" in x.message for x in v)


def test_unknown_model_gpu_and_fp8_without_fp8_cores_are_refused():
    assert "standin.emulate.model" in fields(violations_of(STANDIN, "standin.emulate.model=no/such-model",
                                                           "standin.emulate.gpu=H100"))
    assert "standin.emulate.gpu" in fields(violations_of(STANDIN, EMULATE[0], "standin.emulate.gpu=CPU"))
    assert "standin.emulate.precision" in fields(violations_of(STANDIN, *EMULATE[:1], "standin.emulate.gpu=A100",
                                                               "standin.emulate.precision=fp8"))
    assert "standin.emulate.speed" in fields(violations_of(STANDIN, *EMULATE, "standin.emulate.speed=2"))


def test_with_emulation_the_estimates_are_the_emulated_models_on_the_emulated_gpu():
    # tk bench sets measured TTFT beside the plan's prefill + transfer estimate: under emulated timing that must be
    # the emulated model on the emulated GPU (what the run's timing follows), not the stand-in's tiny model on CPU.
    from toolkit.facts.hardware import GPU_PEAK_TFLOPS
    from toolkit.facts.models import resolve_model
    from toolkit.plan.sizing import PREFILL_EFFICIENCY

    plain, emulated = plan_of(STANDIN), plan_of(STANDIN, *EMULATE)
    assert plain.estimates.gpu_peak_tflops == GPU_PEAK_TFLOPS["CPU"]
    assert emulated.estimates.gpu_peak_tflops == GPU_PEAK_TFLOPS["H100"]
    llama = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    tokens = emulated.kv.largest_request_tokens
    expected_ms = 2 * llama.active_params * tokens / (GPU_PEAK_TFLOPS["H100"] * 1e12 * PREFILL_EFFICIENCY) * 1e3
    assert abs(emulated.estimates.largest_request_prefill_ms - expected_ms) < 0.01


def _validation_run(tmp_path, gbps=((12.5, 20.0),)):
    import json
    run = tmp_path / "validate-run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"kind": "tk-validate-cluster", "passed": True,
                                                 "bandwidth_matrix": {"gbps": [list(r) for r in gbps]},
                                                 "thresholds": {"transport": "tcp"}}))
    return run


def test_a_validation_run_reaches_the_env_as_its_report_and_is_recorded(tmp_path):
    run = _validation_run(tmp_path)
    plan = plan_of(STANDIN, *EMULATE, f"standin.emulate.kv_validation={run}")
    for role in (plan.context, plan.generation):
        assert role.env["TK_STANDIN_EMULATE_KV_REPORT"] == str((run / "report.json").resolve())
        assert role.env["TK_STANDIN_EMULATE_KV_GBPS"] == "3.125"  # the nominal figure stays beside it
    assert plan.recipe["standin"]["emulate"]["kv_validation"] == str(run)


def test_a_validation_run_that_is_not_there_is_refused(tmp_path):
    v = violations_of(STANDIN, *EMULATE, f"standin.emulate.kv_validation={tmp_path / 'nothing'}")
    assert "standin.emulate.kv_validation" in fields(v)
    assert "KV_REPORT" not in str(plan_of(STANDIN, *EMULATE).generation.env)
