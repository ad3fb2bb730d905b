"""The agent graph of a topology config: dependency checks, layers and clusters.

A cluster is a successor's precursor set; early exit and incremental prefill work per cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_ext import protocol as P

if TYPE_CHECKING:
    from router.config import TopologyConfig


class GraphError(ValueError):
    """A graph problem, with the JSON path that causes it."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def sinks(cfg: TopologyConfig) -> list[str]:
    """Agents no other agent reads, in config order."""
    read = {p for a in cfg.agents for p in cfg.templates[a.template].slots}
    return [a.id for a in cfg.agents if a.id not in read]


def layers(cfg: TopologyConfig) -> dict[str, int]:
    """Layer of each agent: 1 for agents without slots, else 1 + the deepest precursor."""
    depth: dict[str, int] = {}

    def visit(agent_id: str) -> int:
        if agent_id not in depth:
            pre = cfg.precursors(agent_id)
            depth[agent_id] = 1 + max((visit(p) for p in pre), default=0)
        return depth[agent_id]

    for a in cfg.agents:
        visit(a.id)
    return depth


def critical_path_chance(cfg: TopologyConfig, agent_id: str) -> float:
    """The chance that `agent_id` is on its question's critical path, knowing only the graph:
    1 over the agents of its layer (of the same depth), one of which ends last. The warm-up gate
    weighs a warm-up's benefit with it (router/compute_device.py)."""
    depth = layers(cfg)
    return 1.0 / sum(d == depth[agent_id] for d in depth.values())


def decode_budget(cfg: TopologyConfig, agent_id: str) -> int:
    """The most tokens `agent_id` decodes: its max_new_tokens, else SGLang's default."""
    return cfg.sampling_of(agent_id).max_new_tokens or P.DEFAULT_MAX_NEW_TOKENS


def remaining_path(cfg: TopologyConfig) -> dict[str, int]:
    """For each agent, the longest chain of decode budgets from it to the final agent, its own
    included: how much decoding its question still has ahead once it starts, if each agent on
    the way writes up to its max_new_tokens (list scheduling's upward rank). Tokens stand for
    time as if every model decoded at one speed: exact where one model serves the graph; where
    several do, the agents whose order matters (those queued on one prefill worker) are of one
    model, and only the paths after them mix speeds."""
    readers = successors(cfg)
    path: dict[str, int] = {}

    def visit(agent_id: str) -> int:
        if agent_id not in path:
            after = max((visit(r) for r in readers[agent_id]), default=0)
            path[agent_id] = decode_budget(cfg, agent_id) + after
        return path[agent_id]

    for a in cfg.agents:
        visit(a.id)
    return path


def successors(cfg: TopologyConfig) -> dict[str, list[str]]:
    """For each agent, the agents that read it."""
    out: dict[str, list[str]] = {a.id: [] for a in cfg.agents}
    for a in cfg.agents:
        for p in cfg.precursors(a.id):
            out[p].append(a.id)
    return out


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A dependency cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (found := dfs(node)):
            return found
    return None


def check_graph(cfg: TopologyConfig) -> None:
    """Raise GraphError for the first problem that would stop the graph from running."""
    ids = [a.id for a in cfg.agents]
    seen: set[str] = set()
    for i, agent_id in enumerate(ids):
        if agent_id in seen:
            raise GraphError(
                f"agents[{i}].id", f"duplicate agent id '{agent_id}'; ids must be unique"
            )
        seen.add(agent_id)

    for i, a in enumerate(cfg.agents):
        if a.model not in cfg.models:
            raise GraphError(
                f"agents[{i}].model",
                f"agent '{a.id}' names model '{a.model}', which is not under \"models\" "
                f"(known: {', '.join(sorted(cfg.models)) or 'none'}); add it or fix the name",
            )
        if a.template not in cfg.templates:
            raise GraphError(
                f"agents[{i}].template",
                f"agent '{a.id}' names template '{a.template}', which is not under \"templates\" "
                f"(known: {', '.join(sorted(cfg.templates))}); add it or fix the name",
            )
        template = cfg.templates[a.template]
        for slot in template.slots:
            if slot == a.id:
                raise GraphError(
                    f"templates.{a.template}.user",
                    f"agent '{a.id}' reads its own answer (slot <|answer:{slot}|>); "
                    "an agent cannot depend on itself",
                )
            if slot not in seen:
                raise GraphError(
                    f"templates.{a.template}.user",
                    f"slot <|answer:{slot}|> names an unknown agent (used by agent '{a.id}'); "
                    f"known agents: {', '.join(ids)}",
                )
        if len(set(template.slots)) != len(template.slots):
            raise GraphError(f"templates.{a.template}.user", "a template names the same slot twice")
        if not template.slots and "{question}" not in template.user:
            raise GraphError(
                f"templates.{a.template}.user",
                f"template '{a.template}' has no {{question}} and no answer slots, so agent "
                f"'{a.id}' would never see the question; add {{question}} to it",
            )

    graph = {a.id: cfg.templates[a.template].slots for a in cfg.agents}
    if cycle := _find_cycle(graph):
        raise GraphError(
            "agents", f"dependency cycle: {' -> '.join(cycle)}; remove one of these slots"
        )

    final = sinks(cfg)
    if len(final) > 1:
        raise GraphError(
            "agents",
            f"{len(final)} final agents ({', '.join(final)}): nobody reads them; a topology has "
            "one final agent, so make one aggregator read the others or remove the extra agents",
        )
    if cfg.final_agent is not None and cfg.final_agent not in final:
        raise GraphError(
            "final_agent",
            f"final_agent '{cfg.final_agent}' is not the graph's final agent ({final[0]})",
        )
