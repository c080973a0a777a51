"""The compute-node agent of `tk validate cluster` (one process per node and role).

It runs inside the serving container, where the toolkit may not be installed: it needs only the Python
standard library, numpy and NIXL, and it never imports ``toolkit``. The toolkit ships it to the nodes as
one file, ``RUN_DIR/agent.pyz`` (a zipapp of this package), and runs

    python3 RUN_DIR/agent.pyz RUN_DIR/params.json AGENT_ID      (or: python3 -m validation ...)

Modules, by job (the numpy-free ones are shared with the coordinator in ``toolkit.validate``):

    wire.py      PROTOCOL, params.json and the result document, the rendezvous info      (no numpy)
    rundir.py    the run directory's rendezvous layout, atomic writes, exit/done markers  (no numpy)
    schedule.py  the round-robin pair schedule                                            (no numpy)
    layout.py    payload geometry: blocks, descriptor fragments, block tables, keys       (no numpy)
    stats.py     percentiles                                                              (no numpy)
    pattern.py   fill and verify patterns over the pools (numpy)
    memory.py    the registered pool, in DRAM or VRAM (numpy; torch or libcudart for VRAM)
    probes.py    preflight probes: NIXL import, GPUs, RDMA NICs, peer memory, UCX protocol info
    messages.py  NIXL notifications between a pair, peer liveness, PairError
    pair.py      one pair: WRITE and READ of KV-shaped requests, every byte verified, the sweep
    faults.py    fault injection (tests): corrupt, kill, hang, absent
    agent.py     the Agent: preflight, rendezvous, the rounds, the barrier, the verdict
    __main__.py  the command line
"""
