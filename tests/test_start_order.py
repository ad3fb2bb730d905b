"""The order a question's agents start in (router/priority.start_order): the longest remaining
decode path first, which is the order the prefill worker queues the first layer's prompts;
the config's order when switched off or where early exit decides at each completion; the
simulator starts them the same way and replays a trace's recorded order."""

from __future__ import annotations

import pytest

from router.config_loader import load_config
from router.context import RouterContext
from router.orchestrator import Session
from router.priority import start_order
from router.topology import decode_budget, remaining_path
from sglang_ext import protocol as P
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster  # noqa: F401

TREE = load_config("tree_9_3_1_cpu")  # leaves of each cluster capped at 48 / 96 / 160 tokens


def test_remaining_path_adds_the_budgets_down_to_the_final_agent():
    path = remaining_path(TREE)
    assert path["final"] == decode_budget(TREE, "final") == 96
    assert path["agg_1"] == 96 + 96
    assert [path[f"leaf_1_{i}"] for i in range(3)] == [48 + 192, 96 + 192, 160 + 192]


def test_an_agent_without_a_budget_counts_sglangs_default():
    cfg = TREE.model_copy(
        update={"sampling": TREE.sampling.model_copy(update={"max_new_tokens": None})}
    )
    assert decode_budget(cfg, "final") == P.DEFAULT_MAX_NEW_TOKENS
    assert remaining_path(cfg)["agg_0"] == 2 * P.DEFAULT_MAX_NEW_TOKENS


def test_the_longest_path_starts_first_and_equals_keep_the_configs_order():
    order = start_order(TREE, critical_path_first=True)
    assert order[:9] == [f"leaf_{c}_{i}" for i in (2, 1, 0) for c in range(3)]
    assert order[9:] == ["agg_0", "agg_1", "agg_2", "final"]
    config = [a.id for a in TREE.agents]
    assert start_order(TREE, critical_path_first=False) == config
    # Early exit (or bypass) decides at each completion: the fastest first, as configured.
    assert start_order(TREE, critical_path_first=True, completion_driven=True) == config


def _leaf_arrivals(worker, leaves: set[str]) -> list[str]:
    """The leaves whose prompts reached `worker`, in arrival order (rid moa-TAG-AGENT-HEX)."""
    agents = [r[P.RID].split("-")[2] for r in worker.requests if r[P.RID].startswith("moa-")]
    return [a for a in agents if a in leaves]


@pytest.mark.parametrize(
    ("start", "early_exit", "first"),
    [
        ("critical_path", False, ["leaf_0_2", "leaf_0_1", "leaf_0_0"]),
        ("config", False, ["leaf_0_0", "leaf_0_1", "leaf_0_2"]),
        ("critical_path", True, ["leaf_0_0", "leaf_0_1", "leaf_0_2"]),
    ],
)
async def test_the_prefill_worker_gets_the_leaves_in_start_order(
    smollm_tokenizer_path,  # noqa: F811
    start,
    early_exit,
    first,
):
    cluster = await start_fake_cluster(smollm_tokenizer_path, decode={"token_delay_s": 0.001})
    try:
        spec = cluster.spec.model_copy(update={"start_order": start})
        cfg = load_config("tree_3_1_cpu")  # leaves capped at 48 / 96 / 160 tokens

        async def no_exit(session, successor, agent):
            return []

        async with RouterContext.open(spec) as ctx:
            hook = no_exit if early_exit else None
            session = Session(ctx, cfg, "What is 2+3?", "pipelined", on_completion=hook)
            result = await session.run_all()
        assert _leaf_arrivals(cluster.prefills[0], set(first)) == first
        indices = {a: result.trace[a]["start_index"] for a in first}
        assert sorted(indices, key=indices.get) == first  # the trace records the order
    finally:
        await cluster.close()


async def test_blocking_and_pipelined_start_alike(smollm_tokenizer_path):  # noqa: F811
    """The start order is one rule for both modes, so the token-identity comparison of #2 and
    #3 still compares one schedule of leaves."""
    cluster = await start_fake_cluster(smollm_tokenizer_path, decode={"token_delay_s": 0.001})
    try:
        cfg = load_config("tree_3_1_cpu")
        orders = []
        spec = cluster.spec.model_copy(update={"start_order": "critical_path"})
        async with RouterContext.open(spec) as ctx:
            for mode in ("blocking", "pipelined"):
                cluster.prefills[0].requests.clear()
                await Session(ctx, cfg, "What is 2+3?", mode).run_all()
                orders.append(
                    _leaf_arrivals(cluster.prefills[0], {"leaf_0_0", "leaf_0_1", "leaf_0_2"})
                )
        assert orders[0] == orders[1] == ["leaf_0_2", "leaf_0_1", "leaf_0_0"]
    finally:
        await cluster.close()


ROW = {"sample_id": "q", "dataset": "gsm8k", "setting": 3, "config": TREE.name, "e2e_s": 1.0}


def test_the_simulator_replays_a_recorded_order_and_else_follows_the_router():
    from experiments.results import ResultRow
    from simulation.workload import from_config, from_trace

    assert from_config(TREE).start_order is None  # decided by the router's rule when it runs
    agents = {a.id: {"model": a.model, "output_ids": [1, 2]} for a in TREE.agents}
    old = ResultRow.model_validate({**ROW, "agents": agents})
    assert from_trace(TREE, old).start_order == tuple(a.id for a in TREE.agents)
    order = start_order(TREE, critical_path_first=True)
    for i, a in enumerate(order):
        agents[a]["start_index"] = i
    new = ResultRow.model_validate({**ROW, "agents": agents})
    assert from_trace(TREE, new).start_order == tuple(order)


def test_the_simulated_leaf_with_the_longest_path_is_prefilled_first():
    from profiling.profile_file import Profile
    from simulation.deployment import default_deployment
    from simulation.predict import simulate_setting
    from tests.test_simulation_validation import DATA

    profile = Profile.load(DATA / "profile_cpu.json")
    deployment = default_deployment([TREE, TREE], profile, 1)
    first_token = {}
    for critical in (True, False):
        out = simulate_setting(
            deployment, [TREE, TREE], profile, 2, 1, 1, critical_path_first=critical
        )
        first_token[critical] = {a: t.first_token_s for a, t in out.rows[0].agents.items()}
    assert first_token[True]["leaf_2_2"] < first_token[True]["leaf_0_0"]
    assert first_token[False]["leaf_2_2"] > first_token[False]["leaf_0_0"]
