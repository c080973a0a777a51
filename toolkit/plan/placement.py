"""Where servers run: instances packed onto nodes and GPUs, one port each."""

from __future__ import annotations

import dataclasses
import math

from orchestrator.states import Role
from toolkit.facts import trtllm
from toolkit.facts.engines import EngineProfile
from toolkit.plan.model import ServerInstance
from toolkit.recipe.schema import RoleSpec


def nodes_per_instance(role: RoleSpec, gpn: int) -> int:
    """How many nodes one instance of the role spans (``packing_problem`` says when it does not pack evenly)."""
    return math.ceil(role.tp * role.pp / gpn)


def packing_problem(role: RoleSpec, gpn: int) -> tuple[str, str] | None:
    """Why an instance of the role does not pack evenly onto gpn-GPU nodes, and the fix; None when it does."""
    world = role.tp * role.pp
    if world <= gpn and gpn % world:
        return (f"an instance of tp*pp={world} GPUs does not pack evenly into {gpn}-GPU nodes",
                f"use tp*pp that divides {gpn}")
    if world > gpn and world % gpn:
        return (f"an instance of tp*pp={world} GPUs spans nodes but is not a multiple of gpus_per_node={gpn}",
                f"use tp*pp that is a multiple of {gpn}")
    return None


class GpuCursor:
    """Hands out GPUs node by node, the way instances are packed onto a Slurm allocation."""

    def __init__(self, gpus_per_node: int):
        self.gpn = gpus_per_node
        self.node = 0
        self.gpu = 0

    def next_node(self) -> None:
        if self.gpu:
            self.node, self.gpu = self.node + 1, 0

    def take(self, world: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if world >= self.gpn:  # whole nodes
            self.next_node()
            span = math.ceil(world / self.gpn)
            nodes = tuple(range(self.node, self.node + span))
            self.node += span
            return nodes, tuple(range(self.gpn))
        if self.gpu + world > self.gpn:
            self.next_node()
        gpus = tuple(range(self.gpu, self.gpu + world))
        node = self.node
        self.gpu += world
        if self.gpu == self.gpn:
            self.node, self.gpu = self.node + 1, 0
        return (node,), gpus


def place(role_name: Role, role: RoleSpec, cursor: GpuCursor, first_port: int,
          uses_mpi: bool) -> tuple[ServerInstance, ...]:
    """The role's instances, in order, from the cursor's next free GPU; ports count up from first_port."""
    world = role.tp * role.pp
    out = []
    for i in range(role.instances):
        nodes, gpus = cursor.take(world)
        ntasks = world if uses_mpi else 1
        out.append(ServerInstance(role=role_name, index=i, nodes=nodes, gpus=gpus, port=first_port + i,
                                  ntasks=ntasks, ntasks_per_node=min(ntasks, cursor.gpn)))
    return tuple(out)


def nodes_used(instances) -> int:
    return len({n for s in instances for n in s.nodes})


def internal_ports(servers: tuple[ServerInstance, ...], version: trtllm.TrtllmVersion, engine: EngineProfile,
                   first_port: int) -> tuple[ServerInstance, ...]:
    """Each instance's own internal ports, or, where the line has no knob for them and the engine starts its
    servers through TensorRT-LLM's launcher, the order co-located instances must start in (facts.trtllm, W2)."""
    envs = version.internal_port_envs
    out, port, last_on_node = [], first_port, {}
    for s in servers:
        if envs:
            pairs = tuple((env, port + k) for k, env in enumerate(envs))
            port += len(envs)
            s = dataclasses.replace(s, internal_ports=pairs)
        elif engine.launcher:
            s = dataclasses.replace(s, start_after=last_on_node.get(s.first_node))
        last_on_node[s.first_node] = s.name
        out.append(s)
    return tuple(out)
