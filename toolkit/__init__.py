"""tk: the TensorRT-LLM disaggregated-serving toolkit.

Pipeline: recipe (load, validate, override) -> plan (pure data) -> render (files)
-> launch (Slurm / local) -> validate (NIXL transfer checks).

The public Python API is `toolkit.api`; the names below are re-exported from it:

    import toolkit
    plan = toolkit.load_plan("llama-3.3-70b-h100", ["generation.instances=4"])

`render`, `launch`, `validate`, `doctor`, `size` and `bench` are not re-exported here: `toolkit.render`, `toolkit.launch`,
`toolkit.validate`, `toolkit.doctor` and `toolkit.size` are packages, and Python sets a package's attribute to its subpackage on
import, so a function of the same name here would be replaced. Call them as `toolkit.api.render(...)`.
"""

__version__ = "0.1.0"

from toolkit.api import (baseline_plan, bench_compare, bench_recipe, bench_target, check_config, diff,  # noqa: E402
                         import_config, launch_baseline, find_run, list_models, list_recipes, load_plan, logs,
                         multi_turn_share, plan_summary, predict, prepare, recipe_path, runs, size_multi_turn, status,
                         stop, validation_runs)
from toolkit.errors import RecipeError, TkError, Violation  # noqa: E402

__all__ = [
    "RecipeError",
    "TkError",
    "Violation",
    "__version__",
    "baseline_plan",
    "bench_compare",
    "bench_recipe",
    "bench_target",
    "check_config",
    "diff",
    "find_run",
    "import_config",
    "launch_baseline",
    "list_models",
    "list_recipes",
    "load_plan",
    "logs",
    "multi_turn_share",
    "plan_summary",
    "predict",
    "prepare",
    "recipe_path",
    "runs",
    "size_multi_turn",
    "status",
    "stop",
    "validation_runs",
]
