"""The devices a plan is solved for: K nodes of N GPUs (each its own memory) or N cores (sharing
the node's RAM), from `moa-pd plan --gpus N[xMEM] | --cpus N[xMEM] [--nodes K]`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from planning.pack import PlanError
from planning.types import GPU

DeviceKind = Literal["gpu", "cpu"]
_COUNT = re.compile(r"(\d+)(?:x(\d+(?:\.\d+)?)\s*(GiB|GB|MiB|MB))?", re.IGNORECASE)
_MIB_PER = {"gib": 1024, "gb": 1e9 / 2**20, "mib": 1, "mb": 1e6 / 2**20}


@dataclass(frozen=True, slots=True)
class Cluster:
    """nodes × per_node devices of one kind; memory_mib is per GPU, or per node's RAM on CPU."""

    kind: DeviceKind
    nodes: list[str]
    per_node: int
    memory_mib: int
    name: str  # "NVIDIA H200" (from the profile), shown in tables

    @property
    def devices(self) -> list[tuple[str, int]]:
        return [(n, i) for n in self.nodes for i in range(self.per_node)]

    def memory_domains(self) -> dict[tuple[str, int | None], int]:
        """{domain: MiB}: a GPU is its own (node, index); a node's cores share (node, None)."""
        if self.kind == "cpu":
            return {(n, None): self.memory_mib for n in self.nodes}
        return {d: self.memory_mib for d in self.devices}

    def domain_of(self, device: tuple[str, int]) -> tuple[str, int | None]:
        return (device[0], None) if self.kind == "cpu" else device

    def gpus(self) -> list[GPU]:
        """One node's GPUs as planning.pack places them (all nodes are alike)."""
        return [GPU(i, self.name, self.memory_mib, self.memory_mib) for i in range(self.per_node)]


def device_key(node: str, kind: DeviceKind, ids: tuple[int, ...] | list[int] = ()) -> str:
    """The simulator's name of what a worker runs on: "node:gpu0", a TP group "node:gpu0,1",
    pinned cores "node:cpu2,3", or a node's unpinned cores "node:cpu" (no ids)."""
    return f"{node}:{kind}{','.join(map(str, ids))}"


def parse_device_key(key: str) -> tuple[str, DeviceKind, list[int]]:
    """(node, kind, ids) of a `device_key`; ids is [] for a node's unpinned cores. A key without
    a node ("cpu", "gpu3": the config default's deployment) has node ""."""
    node, _, rest = key.rpartition(":")
    kind = rest[:3]
    if kind not in ("gpu", "cpu"):
        raise ValueError(f"{key!r} is no device key (node:gpuI[,J] or node:cpu[I,J])")
    ids = rest[3:]
    return node, kind, [int(i) for i in ids.split(",")] if ids else []


def parse_count(flag: str, spec: str, default_mib: int | None) -> tuple[int, int]:
    """`8` or `8x141GiB` -> (count, MiB); without xMEM, default_mib (PlanError if none)."""
    m = _COUNT.fullmatch(spec.strip())
    if not m or int(m.group(1)) < 1:
        raise PlanError(f"{flag} {spec!r}: write a count, optionally x memory, e.g. 8 or 8x141GiB")
    count = int(m.group(1))
    if m.group(2) is None:
        if default_mib is None:
            raise PlanError(
                f"{flag} {spec!r}: give each device's memory (e.g. {count}x80GiB); the profile "
                "does not record it"
            )
        return count, default_mib
    return count, int(float(m.group(2)) * _MIB_PER[m.group(3).lower()])


def cluster(
    kind: DeviceKind,
    spec: str,
    nodes: int,
    default_mib: int | None,
    name: str,
) -> Cluster:
    """The cluster `--gpus/--cpus spec --nodes K` names."""
    if nodes < 1:
        raise PlanError(f"--nodes must be at least 1, got {nodes}")
    count, mib = parse_count(f"--{kind}s", spec, default_mib)
    return Cluster(kind, [f"node{k}" for k in range(nodes)], count, mib, name)
