"""The job's data (job.json) from the Plan, and the job's program (job.pyz).

launch.sbatch only starts the orchestrator (the standalone `orchestrator` package, shipped as job.pyz), which
reads this JobSpec: every component's argv in start order, ports, supervision numbers, membership, the config
check. No value is quoted for a shell here: the job passes argv lists to srun, and the step wrapper receives
every value as a positional argument (orchestrator.steps).
"""

from __future__ import annotations

import functools

from orchestrator.spec import (Component, ConfigCheck, JobSpec, Launcher, Membership, Provenance, Supervision)
from orchestrator.states import ComponentKind, Role
from toolkit.facts import trtllm
from toolkit.plan.model import Plan
from toolkit.zipapps import archive_bytes

JOB_SPEC = "job.json"
JOB_ARCHIVE = "job.pyz"
JOB_PACKAGE = "orchestrator"
JOB_MAIN = "from orchestrator.job import main"

# The etcd the job starts (membership.storage etcd): a one-member cluster, clients on the node's address, peers on
# loopback. $1 node address (<nodeN>), $2 data directory, $3 client port, $4 peer port, $5 the run's certificates
# (RUN/secrets/etcd): with them, only a client holding a certificate of the run's own CA gets in (TLS,
# --client-cert-auth; toolkit.plan.rules.check_membership says why), and the peer port, which every user of the node
# reaches on loopback, speaks only TLS to a member holding the run's peer certificate (--peer-client-cert-auth, and
# --peer-cert-allowed-cn: the run's client certificate, which every gateway presents, is no peer's; peer.crt, CN "tk
# peer", names 127.0.0.1: toolkit.runtime.tls). The flags are etcd's own (`etcd --help` of 3.4; etcd.io
# docs/v3.3/op-guide/security, "Peer (server-to-server / cluster) communication").
ETCD_SH = ('ip=$(getent hosts "$1" | awk "{ print \\$1; exit }"); ip=${ip:-$1}\n'
           'tls=(); scheme=http\n'
           'if [ -n "${5:-}" ]; then scheme=https; tls=(--client-cert-auth --trusted-ca-file "$5/ca.crt" '
           '--cert-file "$5/server.crt" --key-file "$5/server.key" --peer-client-cert-auth '
           '--peer-trusted-ca-file "$5/ca.crt" --peer-cert-file "$5/peer.crt" --peer-key-file "$5/peer.key" '
           '--peer-cert-allowed-cn "tk peer"); fi\n'
           'exec etcd --name tk --data-dir "$2" --listen-client-urls "$scheme://$ip:$3" '
           '--advertise-client-urls "$scheme://$1:$3" --listen-peer-urls "$scheme://127.0.0.1:$4" '
           '--initial-advertise-peer-urls "$scheme://127.0.0.1:$4" --initial-cluster "tk=$scheme://127.0.0.1:$4" '
           '${tls[@]+"${tls[@]}"}')


@functools.lru_cache(maxsize=1)
def job_archive() -> bytes:
    """job.pyz: the installed orchestrator package as a deterministic zipapp (built once per process)."""
    return archive_bytes(JOB_PACKAGE, JOB_MAIN)


def job_spec(plan: Plan) -> JobSpec:
    from toolkit.render import check_command, container_srun_flags, proxy_command, srun_flags, worker_command

    sv = plan.supervision
    minimum = {Role.CTX: sv.min_context, Role.GEN: sv.min_generation, Role.PROXY: 1, Role.ETCD: 1}
    if plan.aggregated is not None:
        minimum[Role.AGG] = sv.min_aggregated
    membership = plan.membership
    progress = trtllm.PROGRESS_PROBE_PATH if sv.stall_after_s > 0 else None
    workers = [Component(
        name=s.name, role=s.role, kind=ComponentKind.WORKER, nodes=list(s.nodes), ntasks=s.ntasks,
        ntasks_per_node=s.ntasks_per_node, gpus=",".join(str(g) for g in s.gpus), env_file=f"{s.role}.env",
        instance_env=[(env, str(port)) for env, port in s.internal_ports],
        argv=[*worker_command(plan, s.role, s.port), plan.engine.options_file_flag, {"run_file": f"{s.role}.yaml"}],
        port=s.port, progress=progress, start_after=s.start_after) for s in plan.servers]
    front = []
    if plan.proxy is not None:
        front.append(Component(
            name="proxy", role=Role.PROXY, kind=ComponentKind.PROXY, nodes=[plan.proxy.node], ntasks=1,
            ntasks_per_node=1, gpus="", env_file="proxy.env", instance_env=[],
            argv=[*proxy_command(plan), "-c", {"run_file": "disagg.resolved.yaml"}], port=plan.proxy.port,
            # with membership its /health is 500 below minimal_instances: the workers' state, not the proxy's
            live="/cluster_info" if membership is not None else "/health"))
    etcd = membership.etcd if membership is not None and membership.etcd and membership.etcd.started_by_job else None
    first = []
    if etcd is not None:
        first.append(Component(
            name="etcd", role=Role.ETCD, kind=ComponentKind.ETCD, nodes=[etcd.node], ntasks=1, ntasks_per_node=1,
            gpus="", env_file="proxy.env", instance_env=[],
            argv=["bash", "-c", ETCD_SH, "tk-etcd", f"<node{etcd.node}>", {"run_file": "etcd"}, str(etcd.port),
                  str(etcd.peer_port), etcd.tls_dir or ""], port=etcd.port, tls=etcd.tls_dir is not None))
    components = [*first, *front, *workers] if membership is not None else [*workers, *front]
    return JobSpec(
        name=plan.name, nodes=plan.slurm.nodes, node_ports=[list(p) for p in plan.ports_by_node],
        srun_flags=srun_flags(plan), components=components,
        supervision=Supervision(
            policy=sv.policy, max_restarts=sv.max_restarts, backoff_initial_s=sv.backoff_initial_s,
            backoff_max_s=sv.backoff_max_s, unhealthy_after_s=sv.unhealthy_after_s, stable_after_s=sv.stable_after_s,
            health_interval_s=sv.health_interval_s, stall_after_s=sv.stall_after_s,
            startup_timeout_s=plan.slurm.startup_timeout_s, minimum=minimum),
        check=ConfigCheck(argv=check_command(plan), options=[(f"{r.role}.yaml", r.model_path) for r in plan.roles],
                          disagg=plan.proxy is not None, timeout_s=trtllm.CONFIG_CHECK_TIMEOUT_S),
        provenance=Provenance(flags=container_srun_flags(plan), image=plan.slurm.container_image or "",
                              version_command=list(plan.engine.version_command)),
        launcher=Launcher(ipc_addr_env=trtllm.LAUNCHER_IPC_ADDR_ENV, stagger_s=trtllm.LAUNCHER_STAGGER_S),
        proxy_first=membership is not None,
        membership=None if membership is None else Membership(
            storage=membership.storage, cluster_uri=membership.cluster_uri,
            worker_key_prefix=membership.worker_key_prefix,
            workers={s.name: f"<node{s.first_node}>:{s.port}" for s in plan.servers},
            tls_dir=membership.etcd.tls_dir if membership.etcd is not None else None,
            # a worker whose key lapsed registers again at its next heartbeat, retrying every 5 s
            rejoin_s=float(membership.heartbeat_interval_s + trtllm.MEMBERSHIP_REGISTER_RETRY_S)),
        disagg_config="disagg.yaml" if plan.proxy is not None else None,
        time_limit_signal=plan.slurm.time_limit_signal,
        toolkit_version=plan.toolkit_version, trtllm_version=plan.trtllm_version)
