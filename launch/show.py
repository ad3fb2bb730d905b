"""`moa-pd show`: a topology as text, layer by layer, each agent with what it reads."""

from __future__ import annotations

from router.config import TopologyConfig
from router.topology import layers, successors


def render_graph(cfg: TopologyConfig) -> str:
    depth = layers(cfg)
    readers = successors(cfg)
    n_layers = max(depth.values())
    lines = [
        (f"{cfg.name}: {len(cfg.agents)} agents in {n_layers} layers, final agent '{cfg.final}'")
    ]
    if cfg.description:
        lines.append(f"  {cfg.description}")
    models = ", ".join(f"{name} = {spec.model_path}" for name, spec in cfg.models.items())
    lines.append(f"  models: {models}")
    for layer in range(1, n_layers + 1):
        ids = [a.id for a in cfg.agents if depth[a.id] == layer]
        lines.append(f"layer {layer} ({len(ids)} agents)")
        for agent_id in ids:
            agent = cfg.agent(agent_id)
            reads = cfg.precursors(agent_id)
            src = f"reads {', '.join(reads)}" if reads else "reads the question"
            to = f" -> {', '.join(readers[agent_id])}" if readers[agent_id] else " (final)"
            lines.append(f"  {agent_id:<10} [{agent.model}] {src}{to}")
    clusters = {a.id: cfg.precursors(a.id) for a in cfg.agents if cfg.precursors(a.id)}
    lines.append("clusters (a successor and its precursor set):")
    lines += [f"  {succ}: {{{', '.join(pre)}}}" for succ, pre in clusters.items()]
    ee = cfg.early_exit
    lines.append(
        f"early exit: {'on' if ee.enabled else 'off'} (method {ee.method}, tau {ee.tau}, "
        f"exponent {ee.exponent}); incremental prefill: "
        f"{cfg.incremental_prefill.chunk_policy if cfg.incremental_prefill.enabled else 'off'}; "
        f"slot order: {cfg.slot_order}"
    )
    return "\n".join(lines)
