"""tk's CPU stand-in engine: a rehearsal engine, **not TensorRT-LLM**.

``tk-standin-serve`` takes ``trtllm-serve``'s command line and LLM-API options file, speaks its HTTP protocol
(OpenAI completions and chat, ``disaggregated_params``, msgpack request bodies) and, in disaggregated mode, moves
each request's KV cache from context to generation server for real with NIXL (host memory, UCX). Its tokens are a
deterministic function of the KV bytes the answering server holds, so a disaggregated deployment answers exactly
like an aggregated one, and a broken transfer changes the answer. See docs/standin.md.

Modules: ``options`` (command line and options file, checked against ``toolkit.facts.trtllm``), ``model`` (tokenizer, KV
content, token stream), ``protocol`` (request/response shapes), ``kv`` (NIXL KV movement), ``worker`` (the
server), ``routers`` and ``proxy`` (``tk-standin-serve disaggregated``), ``baseline`` (an aggregated server for
comparisons).
"""
