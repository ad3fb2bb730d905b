"""The KV pool (tokens) each model's prefill and decode workers need for a config's agents.

An agent's prompt: planning.prompt_length's estimate (its template's tokens, each precursor's
max_new_tokens, an allowance for the question), the one the simulator uses too. Agents are in
flight at once when neither waits for the other (an antichain of the agent graph); the need is
the heaviest such set, × the questions in flight (concurrency). The same sets, counted rather
than weighed, are the requests a decode worker runs at once (`running_needs`).
"""

from __future__ import annotations

from planning.prompt_length import DEFAULT_QUESTION_TOKENS, prompt_tokens
from router.config import TopologyConfig
from router.topology import decode_budget
from sglang_ext.server_args import DEFAULT_MAX_RUNNING_REQUESTS


def max_weight_antichain(cfg: TopologyConfig, weight: dict[str, int]) -> int:
    """The heaviest set of agents none of which (transitively) reads another's answer.

    Weighted Dilworth: it equals the least flow from a source to a sink through the agent graph
    that carries at least weight[a] through each agent a (a network LP, so its optimum is
    integral); solved with scipy's HiGHS."""
    from scipy.optimize import linprog

    ids = [a.id for a in cfg.agents]
    idx = {a: i for i, a in enumerate(ids)}
    edges = [(idx[p], idx[a]) for a in ids for p in cfg.precursors(a)]
    n, m = len(ids), len(edges)
    # Variables: source->agent (n), agent->sink (n), precursor->successor (m).
    nvar = 2 * n + m
    cost = [1.0] * n + [0.0] * (n + m)
    a_eq, a_ub, b_ub = [], [], []
    for v in range(n):
        inflow = [0.0] * nvar
        inflow[v] = 1.0
        for k, (_, dst) in enumerate(edges):
            if dst == v:
                inflow[2 * n + k] = 1.0
        balance = list(inflow)
        balance[n + v] -= 1.0
        for k, (src, _) in enumerate(edges):
            if src == v:
                balance[2 * n + k] -= 1.0
        a_eq.append(balance)
        a_ub.append([-x for x in inflow])
        b_ub.append(-float(weight.get(ids[v], 0)))
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[0.0] * n, method="highs")
    if not res.success:  # cannot happen for a DAG: every flow bound is feasible
        raise RuntimeError(f"antichain LP failed: {res.message}")
    return round(res.fun)


def unused_models(configs: list[TopologyConfig]) -> str | None:
    """Why the configs cannot be deployed when a model they declare is used by none of their
    agents (it would start workers with no pool to size), else None."""
    used = {a.model for cfg in configs for a in cfg.agents}
    for cfg in configs:
        for model in cfg.models:
            if model not in used:
                return (
                    f"{cfg.name}: model '{model}' is declared but no agent uses it; remove it "
                    "from models (or give it an agent)"
                )
    return None


def pool_needs(
    configs: list[TopologyConfig],
    concurrency: int = 1,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
) -> dict[tuple[str, str], int]:
    """{(model, role): KV tokens} over all configs (a model several configs share needs the most
    any one of them needs: `moa-pd run` runs one config's questions at a time).

    decode holds each running request's prompt and every token it generates until it ends.
    prefill holds a prompt only until its KV is sent to decode (then it is evictable radix cache,
    as are warm-ups' prefixes: losing one costs time, not correctness), so its in-flight set is
    weighed by prompts alone. Both are floored at the longest prompt plus its output, the least
    that serves any request of the config."""
    needs: dict[tuple[str, str], int] = {}
    for cfg in configs:
        prompts = {a.id: prompt_tokens(cfg, a.id, question_tokens) for a in cfg.agents}
        for model in cfg.models:
            mine = [a.id for a in cfg.agents if a.model == model]
            if not mine:
                continue
            floor = max(prompts[a] + decode_budget(cfg, a) for a in mine)
            decode = {a: prompts[a] + decode_budget(cfg, a) for a in mine}
            prefill = {a: prompts[a] for a in mine}
            for role, weight in (("prefill", prefill), ("decode", decode)):
                need = max(floor, concurrency * max_weight_antichain(cfg, weight))
                needs[(model, role)] = max(needs.get((model, role), 0), need)
    return needs


def running_needs(configs: list[TopologyConfig], concurrency: int = 1) -> dict[str, int]:
    """{model: requests} its decode workers may have running at once: the most of its agents in
    flight together (an antichain, as for pools), × the questions in flight. A decode worker that
    admits fewer holds the rest in bootstrap before their prefill even starts; under load that
    queue, not compute, was most of a question's time (docs/benchmarks.md, issue 28). Warm-ups
    never reach decode and are not counted."""
    needs: dict[str, int] = {}
    for cfg in configs:
        for model in cfg.models:
            mine = {a.id: 1 for a in cfg.agents if a.model == model}
            if mine:
                need = concurrency * max_weight_antichain(cfg, mine)
                needs[model] = max(needs.get(model, 0), need)
    return needs


def decode_running_requests(server_args: dict, backend: str, need: int) -> int | None:
    """The running requests a model's decode workers start with, given its config's
    `server_args` and the `need` above: the config's own value, else on the reference engine its
    default raised to the need; None where the engine sizes its own (SGLang, from memory). One
    rule for `moa-pd up` (launch/stack.py) and the simulator (simulation/deployment.py)."""
    configured = server_args.get(backend, {}).get("max_running_requests")
    if configured is not None:
        return int(configured)
    return max(DEFAULT_MAX_RUNNING_REQUESTS, need) if backend == "torch" else None
