"""Setting #5, the single-model baseline: each model of the tree config answering alone, as one
agent sampled as the MoA's final answer is, so a reader sees what MoA buys over its best member.
`single_model_configs` builds one single-agent config per model (per pool candidate when the
config declares a pool); the runner registers them with the shell router like any other config
(no early exit, no warm-ups: there is nothing to overlap).
"""

from __future__ import annotations

from router.config import Agent, Sampling, TopologyConfig

AGENT_ID = "single"


def single_model_config(cfg: TopologyConfig, model: str) -> TopologyConfig:
    """`cfg`'s model `model` alone, with the prompt of its first first-layer agent (a model
    with no first-layer agent: the first leaf's) and the sampling of the final agent, which
    writes the MoA's answer (the CPU configs cap leaves shorter to mimic slower models)."""
    if not any(a.model == model for a in cfg.agents):
        raise ValueError(f"config '{cfg.name}' has no agent of model '{model}'")
    leaves = [a for a in cfg.agents if not cfg.precursors(a.id)]
    base = next((a for a in leaves if a.model == model), leaves[0]).model_copy(
        update={"model": model}
    )
    sampling = cfg.sampling_of(cfg.final)
    name = f"{cfg.name}-single-{model}"
    return _config_of(cfg, base, base.template, sampling, name, f"model {model}")


def single_candidate_config(cfg: TopologyConfig, candidate: str) -> TopologyConfig:
    """Pool candidate `candidate` alone, exactly as the routed setting runs it as a leaf: the
    agent its pool entry expands to (router/config.py), with that agent's template (the persona
    as its system prompt) and sampling (its correctness here is what the scorer learns)."""
    agent = cfg.agent(candidate)
    name = f"{cfg.name}-single-{candidate}"
    what = f"pool candidate {candidate}"
    return _config_of(cfg, agent, agent.template, cfg.sampling_of(candidate), name, what)


def _config_of(
    cfg: TopologyConfig, base: Agent, template: str, sampling: Sampling, name: str, what: str
) -> TopologyConfig:
    """A one-agent config: `base` (renamed AGENT_ID) with `cfg`'s template `template`."""
    agent = base.model_copy(update={"id": AGENT_ID, "sampling": sampling})
    return TopologyConfig.model_validate(
        {
            "name": name,
            "description": f"setting #5: {what} of {cfg.name} alone",
            "models": {base.model: cfg.models[base.model].model_dump()},
            "templates": {template: cfg.templates[template].model_dump()},
            "agents": [agent.model_dump()],
            "sampling": cfg.sampling.model_dump(),
        }
    )


def single_model_configs(cfg: TopologyConfig) -> dict[str, TopologyConfig]:
    """candidate id → its single-agent config: each pool candidate when the config has a pool,
    else each model of the config (its name is its id), in the config's order."""
    if cfg.pool is not None:
        return {c.id: single_candidate_config(cfg, c.id) for c in cfg.pool.candidates}
    return {
        m: single_model_config(cfg, m) for m in cfg.models if any(a.model == m for a in cfg.agents)
    }
