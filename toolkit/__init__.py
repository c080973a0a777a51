"""tk: the TensorRT-LLM disaggregated-serving toolkit.

Pipeline: recipe (load, validate, override) -> plan (pure data) -> render (files)
-> launch (Slurm / local) -> validation (NIXL transfer checks).
"""

__version__ = "0.1.0"
