"""Facts: pure data about the things tk deploys, read by every stage and by nothing else's logic.

- ``trtllm``: what each TensorRT-LLM release line accepts, and every TensorRT-LLM name tk writes
  (env selectors, CLI flags, the options-file flag, option keys tk owns).
- ``models``: model architectures (built-in catalogue or a config.json) and their KV bytes per token.
- ``hardware``: GPUs and KV transport profiles.
- ``engines``: one ``EngineProfile`` row per serving engine (TensorRT-LLM, the CPU stand-in).

No stage logic and no I/O here, except reading a model's config.json. Imports nothing else from tk.
"""
