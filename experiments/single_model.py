"""Setting #5, the single-model baseline: each model of the tree config answering alone, as one
agent sampled as the MoA's final answer is, so a reader sees what MoA buys over its best member.
`single_model_configs` builds one single-agent config per model; the runner registers them with
the shell router like any other config (no early exit, no warm-ups: there is nothing to overlap).
"""

from __future__ import annotations

from router.config import TopologyConfig

AGENT_ID = "single"


def single_model_config(cfg: TopologyConfig, model: str) -> TopologyConfig:
    """`cfg`'s model `model` alone, with the prompt of its first first-layer agent (a model
    with no first-layer agent: the first leaf's) and the sampling of the final agent, which
    writes the MoA's answer (the CPU configs cap leaves shorter to mimic slower models)."""
    if not any(a.model == model for a in cfg.agents):
        raise ValueError(f"config '{cfg.name}' has no agent of model '{model}'")
    leaves = [a for a in cfg.agents if not cfg.precursors(a.id)]
    mine = [a for a in leaves if a.model == model]
    base = mine[0] if mine else leaves[0]
    sampling = cfg.sampling_of(cfg.final)
    agent = base.model_copy(update={"id": AGENT_ID, "model": model, "sampling": sampling})
    return TopologyConfig.model_validate(
        {
            "name": f"{cfg.name}-single-{model}",
            "description": f"setting #5: model {model} of {cfg.name} alone",
            "models": {model: cfg.models[model].model_dump()},
            "templates": {base.template: cfg.templates[base.template].model_dump()},
            "agents": [agent.model_dump()],
            "sampling": cfg.sampling.model_dump(),
        }
    )


def single_model_configs(cfg: TopologyConfig) -> dict[str, TopologyConfig]:
    """model name → its single-agent config, in the config's model order."""
    return {
        m: single_model_config(cfg, m) for m in cfg.models if any(a.model == m for a in cfg.agents)
    }
