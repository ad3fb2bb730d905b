"""`moa-pd show`: a topology as text, layer by layer, each agent with what it reads."""

from __future__ import annotations

import argparse
import sys

from router.config import TopologyConfig
from router.config_loader import load_config
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", metavar="CONFIG", help="a config file's path or a name")
    p.add_argument("--config", dest="config_opt", metavar="CONFIG", help="the same, as an option")


def main(args: argparse.Namespace) -> int:
    if bool(args.config) == bool(args.config_opt):
        print(
            "error: name one config, as `moa-pd show CONFIG` or `--config CONFIG`", file=sys.stderr
        )
        return 2
    print(render_graph(load_config(args.config or args.config_opt)))
    return 0
