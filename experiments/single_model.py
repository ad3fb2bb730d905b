"""Setting #5, the single-model baseline: each model of the tree config answering alone, as one
agent sampled as the MoA's final answer is, so a reader sees what MoA buys over its best member.
`single_model_configs` builds one single-agent config per model (per pool candidate when the
config declares a pool); the runner registers them with the shell router like any other config
(no early exit, no warm-ups: there is nothing to overlap).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from router.config import Sampling, TopologyConfig

AGENT_ID = "single"


@dataclass(frozen=True, slots=True)
class PoolCandidate:
    """One pool entry: a model with an optional persona (system prompt) and sampling overrides."""

    id: str
    model: str
    persona: str | None = None
    sampling: dict = field(default_factory=dict)


def pool_candidates(raw: Mapping) -> list[PoolCandidate] | None:
    """The `pool` of a raw config dict, or None when it has none.

    MERGE: router/config.py's typed `pool` (other branch) validates this section; once merged,
    callers pass `cfg.pool` and this reader goes. Until then it reads defensively and names
    the JSON path of what it cannot use."""
    pool = raw.get("pool")
    if pool is None:
        return None
    if isinstance(pool, Mapping):  # a pool with more keys than its candidates
        pool = pool.get("candidates")
    if not isinstance(pool, list) or not pool:
        raise ValueError("pool: expected a non-empty list of {id, model, persona, sampling}")
    out = []
    for i, entry in enumerate(pool):
        if not isinstance(entry, Mapping) or not entry.get("id") or not entry.get("model"):
            raise ValueError(f"pool[{i}]: each candidate needs an 'id' and a 'model'")
        sampling = entry.get("sampling") or {}
        Sampling.model_validate(sampling)  # a bad override fails here, not inside a question
        out.append(PoolCandidate(entry["id"], entry["model"], entry.get("persona"), sampling))
    return out


def single_model_config(cfg: TopologyConfig, model: str) -> TopologyConfig:
    """`cfg`'s model `model` alone, with the prompt of its first first-layer agent (a model
    with no first-layer agent: the first leaf's) and the sampling of the final agent, which
    writes the MoA's answer (the CPU configs cap leaves shorter to mimic slower models)."""
    if not any(a.model == model for a in cfg.agents):
        raise ValueError(f"config '{cfg.name}' has no agent of model '{model}'")
    sampling = cfg.sampling_of(cfg.final)
    return _alone(cfg, model, None, sampling, f"{cfg.name}-single-{model}", f"model {model}")


def single_candidate_config(cfg: TopologyConfig, cand: PoolCandidate) -> TopologyConfig:
    """Pool candidate `cand` alone, as the routed setting runs it as a leaf: its model, its
    persona as the system prompt of the first leaf's template, and its sampling overrides over
    the config-wide sampling (its correctness here is what the scorer learns to predict)."""
    if cand.model not in cfg.models:
        raise ValueError(
            f"pool candidate '{cand.id}': model '{cand.model}' is not in the config's models"
        )
    sampling = Sampling.model_validate(cand.sampling).merged_over(cfg.sampling)
    name = f"{cfg.name}-single-{cand.id}"
    return _alone(cfg, cand.model, cand.persona, sampling, name, f"pool candidate {cand.id}")


def _alone(
    cfg: TopologyConfig,
    model: str,
    persona: str | None,
    sampling: Sampling,
    name: str,
    what: str,
) -> TopologyConfig:
    leaves = [a for a in cfg.agents if not cfg.precursors(a.id)]
    mine = [a for a in leaves if a.model == model]
    base = mine[0] if mine else leaves[0]
    template = cfg.templates[base.template]
    if persona is not None:
        template = template.model_copy(update={"system": persona})
    agent = base.model_copy(update={"id": AGENT_ID, "model": model, "sampling": sampling})
    return TopologyConfig.model_validate(
        {
            "name": name,
            "description": f"setting #5: {what} of {cfg.name} alone",
            "models": {model: cfg.models[model].model_dump()},
            "templates": {base.template: template.model_dump()},
            "agents": [agent.model_dump()],
            "sampling": cfg.sampling.model_dump(),
        }
    )


def single_model_configs(
    cfg: TopologyConfig, pool: list[PoolCandidate] | None = None
) -> dict[str, TopologyConfig]:
    """candidate id → its single-agent config: each pool candidate when there is a pool, else
    each model of the config (its name is its id), in the config's order."""
    if pool:
        return {c.id: single_candidate_config(cfg, c) for c in pool}
    return {
        m: single_model_config(cfg, m) for m in cfg.models if any(a.model == m for a in cfg.agents)
    }
