"""Stage 2: the resolved deployment (roles, instances, nodes, GPUs, ports, KV geometry, env) as pure data."""

from toolkit.plan.build import build_plan, plan_for_run
from toolkit.plan.aggregated import aggregated_plan
from toolkit.plan.model import Plan, RolePlan, ServerInstance

__all__ = ["Plan", "RolePlan", "ServerInstance", "aggregated_plan", "build_plan", "plan_for_run"]
