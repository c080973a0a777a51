"""Stage 2: the resolved deployment (roles, instances, nodes, GPUs, ports, KV geometry, env) as pure data."""

from tk.plan.build import build_plan
from tk.plan.hardware import TRANSPORT_PROFILES
from tk.plan.model import Plan, RolePlan, ServerInstance

__all__ = ["Plan", "RolePlan", "ServerInstance", "TRANSPORT_PROFILES", "build_plan"]
