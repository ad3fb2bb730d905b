"""The planner's cost model: the device time a round of `concurrency` questions costs each (model,
role), from the configs' agents (prompt and output lengths as planning.pool_need derives them) and
a profile's fitted costs. The MILP (planning.ilp) minimizes the busiest device's load under it;
`device_loads` evaluates any plan (the baselines too) the same way.

A round: `concurrency` questions in flight, each making its agents' requests once. Prefill is work
proportional to a replica's share. A decode replica runs the steps of the longest chain of the
model's outputs in a question whatever its share (a step's fixed part, weights read, is paid per
replica), plus a per-token part for its share of the round's tokens (the step's per-sequence and
KV parts): step(b) = fixed + b * per_token, so replicas of a decode pool add fixed cost and
divide the rest.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from planning.pack import PlanError
from planning.pool_need import max_weight_antichain, pool_needs, unused_models
from planning.prompt_length import prompt_tokens
from profiling.profile_file import ModelProfile, Profile
from router.config import TopologyConfig
from router.topology import decode_budget

ROLES = ("prefill", "decode")
# A tensor-parallel worker's time on each of its GPUs, against one GPU's: profiles are measured at
# tp 1, and TP's all-reduces keep it short of dividing by tp (an estimate, not a measurement).
TP_EFFICIENCY = 0.8


@dataclass(frozen=True, slots=True)
class RoleWork:
    """One (model, role)'s load in a round, and the memory its KV pool needs."""

    model: str
    role: str
    fixed_s: float  # seconds each replica spends whatever its share (decode's per-step fixed part)
    shared_s: float  # seconds of the whole round's work, divided among replicas by share
    pool_need: int  # KV tokens the round keeps in flight (planning.pool_need), divided by share
    pool_floor: int  # the least pool a replica serves any request with: longest prompt + output
    weights_bytes: int
    kv_bytes_per_token: int

    def seconds(self, share: float, tp: int = 1) -> float:
        """Device time of one replica that takes `share` of the requests, on each of its GPUs."""
        return (self.fixed_s + share * self.shared_s) / tp_speedup(tp)


def tp_speedup(tp: int) -> float:
    return 1.0 if tp <= 1 else tp * TP_EFFICIENCY


def _chain(cfg: TopologyConfig, weight: dict[str, float]) -> float:
    """The heaviest path of agents, each reading the one before (a question's critical path)."""

    @functools.cache
    def upto(agent: str) -> float:
        return weight.get(agent, 0.0) + max((upto(p) for p in cfg.precursors(agent)), default=0.0)

    return max(upto(a.id) for a in cfg.agents)


def _decode_parts(mp: ModelProfile, context: float) -> tuple[float, float]:
    """(fixed, per sequence) of a decode step at this context: the profile's fit is linear in the
    batch, so two evaluations recover it exactly."""
    one, two = mp.decode_step_seconds(1, context), mp.decode_step_seconds(2, context)
    return max(0.0, 2 * one - two), max(0.0, two - one)


def _model_profile(profile: Profile, cfg: TopologyConfig, model: str) -> ModelProfile:
    try:
        return profile.models[model]
    except KeyError:
        raise PlanError(
            f"{cfg.name}: model '{model}' has no costs in the profile (it has "
            f"{sorted(profile.models)}); run `moa-pd profile --config` on this config"
        ) from None


def role_work(
    configs: list[TopologyConfig],
    profile: Profile,
    concurrency: int,
    question_tokens: int,
) -> dict[tuple[str, str], RoleWork]:
    """{(model, role): its load in a round}; several configs' rounds add up (a deployment that
    serves them all at once)."""
    if unused := unused_models(configs):
        raise PlanError(unused)
    needs = pool_needs(configs, concurrency, question_tokens)
    fixed: dict[tuple[str, str], float] = {}
    shared: dict[tuple[str, str], float] = {}
    floor: dict[str, int] = {}
    for cfg in configs:
        prompts = {a.id: prompt_tokens(cfg, a.id, question_tokens) for a in cfg.agents}
        outputs = {a.id: decode_budget(cfg, a.id) for a in cfg.agents}
        for model in cfg.models:
            mine = [a.id for a in cfg.agents if a.model == model]
            mp = _model_profile(profile, cfg, model)
            floor[model] = max(floor.get(model, 0), *(prompts[a] + outputs[a] for a in mine))
            prefill = sum(mp.prefill_seconds(prompts[a]) for a in mine)
            shared[(model, "prefill")] = shared.get((model, "prefill"), 0.0) + concurrency * prefill
            tokens = sum(outputs[a] for a in mine)
            context = sum(outputs[a] * (prompts[a] + outputs[a] / 2) for a in mine) / tokens
            step_fixed, per_token = _decode_parts(mp, context)
            steps = _chain(cfg, {a: outputs[a] for a in mine})
            key = (model, "decode")
            fixed[key] = fixed.get(key, 0.0) + steps * step_fixed
            shared[key] = shared.get(key, 0.0) + concurrency * tokens * per_token
    return {
        (m, r): RoleWork(
            m,
            r,
            fixed.get((m, r), 0.0),
            shared[(m, r)],
            needs[(m, r)],
            floor[m],
            profile.models[m].weights_bytes,
            profile.models[m].kv_bytes_per_token,
        )
        for (m, r) in shared
    }


@dataclass(frozen=True, slots=True)
class Replica:
    """One worker of a plan as the cost model sees it: its devices (node, index) and share."""

    model: str
    role: str
    devices: tuple[tuple[str, int], ...]
    share: float


def critical_path_seconds(
    configs: list[TopologyConfig],
    profile: Profile,
    concurrency: int,
    question_tokens: int,
    replicas: list[Replica] | None = None,
) -> float:
    """The longest chain of one question's requests (PD fixed cost, prefill, its decode steps),
    over the configs. A request meets the replica its share sends it to: the batch there is the
    round's batch × that share, its time divided by the replica's TP speed-up (no replicas: one
    replica per role, tp 1)."""
    longest = 0.0
    for cfg in configs:
        batch = {  # a model's agents decoding at once in a question, × the questions in flight
            m: concurrency
            * max_weight_antichain(cfg, {a.id: 1 for a in cfg.agents if a.model == m})
            for m in cfg.models
        }
        weight = {}
        for a in cfg.agents:
            mp = _model_profile(profile, cfg, a.model)
            prompt, out = prompt_tokens(cfg, a.id, question_tokens), decode_budget(cfg, a.id)
            mine = [r for r in replicas or () if r.model == a.model]
            prefills = [(r.share, len(r.devices)) for r in mine if r.role == "prefill"]
            decodes = [(r.share, len(r.devices)) for r in mine if r.role == "decode"]
            prefill = sum(
                share * mp.prefill_seconds(prompt) / tp_speedup(tp)
                for share, tp in prefills or [(1.0, 1)]
            )
            step = sum(
                share
                * mp.decode_step_seconds(max(1.0, batch[a.model] * share), prompt + out / 2)
                / tp_speedup(tp)
                for share, tp in decodes or [(1.0, 1)]
            )
            weight[a.id] = mp.pd_seconds(prompt) + prefill + out * step
        longest = max(longest, _chain(cfg, weight))
    return longest


def device_loads(
    replicas: list[Replica], work: dict[tuple[str, str], RoleWork]
) -> dict[tuple[str, int], float]:
    """Seconds of a round's work on each device: workers sharing a device share its time."""
    loads: dict[tuple[str, int], float] = {}
    for r in replicas:
        seconds = work[(r.model, r.role)].seconds(r.share, len(r.devices))
        for d in r.devices:
            loads[d] = loads.get(d, 0.0) + seconds
    return loads
