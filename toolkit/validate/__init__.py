"""`tk validate cluster`: real NIXL transfers shaped like a recipe's KV blocks between every context and
generation node, every byte checked, bandwidth and latency measured (see docs/validate.md).

    ship.py      builds RUN_DIR/agent.pyz: the per-node agent (the top-level `validation` package,
                 stdlib + numpy + NIXL only) as one file, a zipapp
    params.py    what the agents do: nodes, schedule, payload geometry, timeouts
    launchers.py local processes, srun inside an allocation, or a Slurm job of its own
    run.py       the coordinator: start, watch (bounded), gather, release
    report.py    the merged report (schema: report.schema.json) and its terminal rendering

Nothing here imports numpy or NIXL: from `validation` the coordinator imports only its numpy-free
modules (wire, layout, schedule, stats).
"""
