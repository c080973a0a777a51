"""The job's orchestrator: what runs on the batch host of a deployment (standard library only, Python >= 3.8).

`tk render` writes job.json (orchestrator.spec) and ships this package as job.pyz; launch.sbatch only starts it:

    python3 job.pyz RUN_DIR/job.json

Modules, one job each:
    spec        job.json: the JobSpec dataclasses and their codec (shared with tk)
    states      run and component states and event kinds, as Enums (shared with tk)
    policy      the supervision policy: a pure state machine over the components, with a clock passed in
    probe       concurrent, bounded HTTP probes (liveness rounds, progress probes)
    steps       srun steps: start, find, kill; every Slurm call bounded
    membership  TensorRT-LLM's cluster storage: registered, deregister, repair after an etcd outage
    tls         the run's client certificate, presented on every call to the etcd the job starts
    events      state/events.jsonl and state/servers/NAME.json
    background  every thread the job starts: a failure is an event (component, cause), never silent
    startup     nodes, ports, placeholders, provenance, the config check, launcher staggering
    job         the job's life: start-up, supervision, teardown on every signal

It never imports toolkit (import-linter contract `job-standalone`).
"""
