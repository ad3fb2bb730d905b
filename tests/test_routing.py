"""Routing (issue 20): the pool and routing sections of a config (expansion, validation errors
by file and JSON path, configs without them unchanged), the choice (k, threshold, min_k,
weights), posterior correction (drop/last), and a routed question on fake PD workers: only the
chosen proposers run, the successor's prompt takes as many answers as were chosen, the trace
says which and why."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from router.config import Routing, Template
from router.config_loader import ConfigError, load_config, parse_config
from router.context import RouterContext
from router.early_exit import AgentResult
from router.orchestrator import Session
from routing.choose import choose
from routing.estimates import Estimate
from routing.pool_expansion import expand_pool
from routing.posterior import correct
from routing.router_hook import PoolRouters, load_scorer
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_SCORER = ROOT / "tests" / "fixtures" / "scorer_pool_cpu.json"
AGG_USER = "Question:\n{question}\n\nCandidates:\n\n<|answers:pool|>\n\nAnswer."


def pooled(n: int = 4, **routing) -> dict:
    """A one-model config: a pool of `n` persona candidates read by one aggregator."""
    return {
        "name": "routed_t",
        "models": {"smollm2": {"model_path": "smollm2-135m"}},
        "pool": {
            "candidates": [
                {"id": f"c{i}", "model": "smollm2", "persona": f"You are persona {i}."}
                for i in range(n)
            ]
        },
        "routing": {"scorer": str(FIXTURE_SCORER), "k": 2, **routing},
        "templates": {"agg": {"user": AGG_USER}},
        "agents": [{"id": "final", "model": "smollm2", "template": "agg"}],
    }


def error_for(raw: dict, tmp_path: Path) -> ConfigError:
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert str(f) in str(info.value)
    return info.value


# --- config -------------------------------------------------------------------------------------
def test_the_pool_expands_to_agents_and_one_slot_per_candidate():
    cfg = parse_config(json.dumps(pooled(3)))
    assert [a.id for a in cfg.agents] == ["c0", "c1", "c2", "final"]
    assert cfg.pool_ids == ["c0", "c1", "c2"]
    assert cfg.precursors("final") == ["c0", "c1", "c2"]
    assert cfg.templates["pool.c1"] == Template(user="{question}", system="You are persona 1.")
    user = cfg.template_of("final").user
    assert "[Candidate 1]\n<|answer:c0|>\n\n[Candidate 2]\n<|answer:c1|>\n\n" in user
    # Idempotent: a dumped config parses to itself (the runner and the router re-validate).
    again = parse_config(json.dumps(cfg.model_dump(mode="json")))
    assert again == cfg


def test_the_schema_alone_names_an_unexpanded_pool():
    # The loader expands pools (routing.pool_expansion); validating the raw JSON with the
    # schema alone skips that, and says so instead of failing on the missing agents.
    from pydantic import ValidationError

    from router.config import TopologyConfig

    with pytest.raises(ValidationError, match="the pool was not expanded"):
        TopologyConfig.model_validate(pooled(2))
    assert TopologyConfig.model_validate(expand_pool(pooled(2))) == parse_config(
        json.dumps(pooled(2))
    )


def test_a_pool_config_is_the_same_topology_as_its_hand_written_twin():
    cfg = parse_config(json.dumps(pooled(2)))
    twin = {
        "name": "routed_t",
        "models": {"smollm2": {"model_path": "smollm2-135m"}},
        "templates": {
            "pool.c0": {"system": "You are persona 0.", "user": "{question}"},
            "pool.c1": {"system": "You are persona 1.", "user": "{question}"},
            "agg": {
                "user": AGG_USER.replace(
                    "<|answers:pool|>",
                    "[Candidate 1]\n<|answer:c0|>\n\n[Candidate 2]\n<|answer:c1|>",
                )
            },
        },
        "agents": [
            {"id": "c0", "model": "smollm2", "template": "pool.c0"},
            {"id": "c1", "model": "smollm2", "template": "pool.c1"},
            {"id": "final", "model": "smollm2", "template": "agg"},
        ],
    }
    plain = parse_config(json.dumps(twin))
    assert plain.agents == cfg.agents and plain.templates == cfg.templates


def test_configs_without_a_pool_are_unchanged():
    for f in sorted((ROOT / "cfgs").glob("*.json")):
        raw = json.loads(f.read_text())
        if "pool" in raw:
            continue
        assert expand_pool(copy.deepcopy(raw)) == raw, f.name
        cfg = load_config(f)
        assert cfg.pool is None and cfg.routing is None and cfg.pool_ids == []
        assert [a.model_dump(exclude_defaults=True) for a in cfg.agents] == [
            {k: v for k, v in a.items() if not (k == "sampling" and not v)} for a in raw["agents"]
        ], f.name
        assert {k: t.model_dump(exclude_none=True) for k, t in cfg.templates.items()} == raw[
            "templates"
        ], f.name


@pytest.mark.parametrize(
    ("edit", "path", "words"),
    [
        (
            lambda c: c["pool"]["candidates"][1].update(model="nope"),
            "pool.candidates[1].model",
            "not under",
        ),
        (
            lambda c: c["pool"]["candidates"][1].update(id="c0"),
            "pool.candidates[1].id",
            "duplicate",
        ),
        (
            lambda c: c["pool"]["candidates"][2].update(temp=1),
            "pool.candidates[2].temp",
            "unknown key",
        ),
        (lambda c: c["pool"].update(candidates=[]), "pool.candidates", "no candidates"),
        (lambda c: c["pool"].update(item="[{n}]"), "pool.item", "exactly once"),
        (lambda c: c["routing"].update(k=9), "routing.k", "the pool has 4"),
        (lambda c: c["routing"].update(threshold=0.5), "routing", "exactly one"),
        (lambda c: c["routing"].update(min_k=0), "routing.min_k", "greater than or equal"),
        (
            lambda c: (
                c["routing"]["weights"].update(cost=-1)
                if "weights" in c["routing"]
                else c["routing"].update(weights={"cost": -1})
            ),
            "routing.weights.cost",
            "greater",
        ),
        (
            lambda c: c["routing"].update(posterior_correction={"action": "skip"}),
            "routing.posterior_correction.action",
            "drop",
        ),
        (lambda c: c.pop("pool"), "routing", "add a pool"),
        (
            lambda c: c["templates"]["agg"].update(user="{question}"),
            "pool",
            "no template reads the pool",
        ),
        (
            lambda c: c["agents"].insert(0, {"id": "c0", "model": "smollm2", "template": "agg"}),
            "pool.candidates[0].id",
            "declared agent",
        ),
    ],
)
def test_pool_and_routing_errors_name_the_file_and_json_path(tmp_path, edit, path, words):
    raw = pooled(4)
    edit(raw)
    err = error_for(raw, tmp_path)
    assert err.path == path, str(err)
    assert words in err.message, str(err)


def test_shipped_routed_configs_load_and_the_cpu_one_ships_its_scorer():
    cpu = load_config("routed_pool_cpu")
    assert len(cpu.pool_ids) >= 4 and len({cpu.agent(c).model for c in cpu.pool_ids}) == 3
    gpu = load_config("routed_pool_qwen3_gpu")
    assert {gpu.agent(c).model for c in gpu.pool_ids} == {"qwen3-4b", "qwen3-8b", "qwen3-32b"}
    # The scorer it names is in the repository (issue 30: it ran on no fresh clone before),
    # resolved from any working directory, and has a model for every candidate.
    assert not Path(cpu.routing.scorer).is_absolute()
    assert (ROOT / cpu.routing.scorer).is_file()
    scorer = load_scorer(cpu, "t")
    assert set(scorer.candidates) == set(cpu.pool_ids)
    assert scorer.embedder == cpu.early_exit.embedding_model
    # The fixture covers the pool too (it keeps the candidate the pool left out).
    routed = cpu.model_copy(
        update={"routing": cpu.routing.model_copy(update={"scorer": str(FIXTURE_SCORER)})}
    )
    assert set(load_scorer(routed, "t").candidates) >= set(cpu.pool_ids)


def test_a_missing_scorer_or_candidate_is_named(tmp_path):
    cfg = parse_config(json.dumps(pooled(2, scorer=str(tmp_path / "none.json"))))
    with pytest.raises(ConfigError, match="routing.scorer: cannot read"):
        load_scorer(cfg, "t")
    doc = json.loads(FIXTURE_SCORER.read_text())
    doc["candidates"] = {"c0": next(iter(doc["candidates"].values()))}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    cfg = parse_config(json.dumps(pooled(2, scorer=str(tmp_path / "s.json"))))
    with pytest.raises(ConfigError, match=r"no model for pool candidates \['c1'\]"):
        load_scorer(cfg, "t")


# --- the choice ---------------------------------------------------------------------------------
def est(cost: float, latency: float | None = None) -> Estimate:
    return Estimate(tokens=100, size_b=cost / 100, cost=cost, latency_s=latency)


POOL = ["a", "b", "c", "d"]
P = {"a": 0.9, "b": 0.6, "c": 0.55, "d": 0.2}


def rule(**kw) -> Routing:
    return Routing(scorer="x", **kw)


def test_k_runs_the_k_best_and_says_why():
    d = choose(P, {c: est(10) for c in POOL}, rule(k=2), POOL)
    assert d.chosen == ["a", "b"] and d.rule == "k=2, min_k=1"
    by = {c.id: c for c in d.candidates}
    assert by["b"].reason == "rank 2 within k=2" and by["c"].reason == "rank 3 beyond k=2"


def test_cost_and_latency_weights_change_the_ranking():
    costs = {"a": est(400, 8.0), "b": est(50, 1.0), "c": est(40, 1.0), "d": est(10, 0.5)}
    assert choose(P, costs, rule(k=2), POOL).chosen == ["a", "b"]
    cheap = rule(k=2, weights={"performance": 1.0, "cost": 1.0})
    d = choose(P, costs, cheap, POOL)
    assert d.chosen == ["b", "c"]  # a's p lead does not pay for 8x the cost
    assert {c.id: c.cost_share for c in d.candidates}["a"] == 1.0
    fast = rule(k=1, weights={"performance": 1.0, "latency": 1.0})
    assert choose(P, costs, fast, POOL).chosen == ["b"]


def test_threshold_and_min_k():
    costs = {c: est(10) for c in POOL}
    assert choose(P, costs, rule(threshold=0.5), POOL).chosen == ["a", "b", "c"]
    d = choose(P, costs, rule(threshold=0.95, min_k=2), POOL)
    assert d.chosen == ["a", "b"]
    by = {c.id: c for c in d.candidates}
    assert "below threshold 0.95" in by["a"].reason and "min_k=2" in by["a"].reason
    assert "min_k" not in by["c"].reason and not by["c"].chosen
    with pytest.raises(ValueError, match=r"no probability for candidates \['d'\]"):
        choose({k: v for k, v in P.items() if k != "d"}, costs, rule(k=1), POOL)
    # min_k holds in k mode too: k=1 with min_k=3 runs three.
    d = choose(P, costs, rule(k=1, min_k=3), POOL)
    assert d.chosen == ["a", "b", "c"] and d.rule == "k=1, min_k=3"
    assert "added (rank 3) to reach min_k=3" in {c.id: c for c in d.candidates}["c"].reason


def modeled(models: dict[str, str], cost: float = 10.0) -> dict[str, Estimate]:
    return {
        c: Estimate(tokens=100, size_b=cost / 100, cost=cost, latency_s=None, model=m)
        for c, m in models.items()
    }


def test_max_per_model_keeps_one_persona_of_a_model_unless_min_k_needs_more():
    costs = modeled({"a": "smol", "b": "smol", "c": "qwen", "d": "gemma"})
    d = choose(P, costs, rule(threshold=0.5, max_per_model=1), POOL)
    assert d.chosen == ["a", "c"]  # b (p 0.6) is a's model's second persona
    assert "its model 'smol' has 1 chosen already" in {c.id: c for c in d.candidates}["b"].reason
    d = choose(P, costs, rule(k=2, max_per_model=1), POOL)
    assert d.chosen == ["a", "c"]  # the two best the cap allows
    assert {c.id: c for c in d.candidates}["d"].reason == "rank 4 beyond k=2"
    # The cap gives way where min_k cannot be reached within it.
    d = choose(P, costs, rule(k=2, min_k=4, max_per_model=1), POOL)
    assert d.chosen == POOL and "to reach min_k=4" in {c.id: c for c in d.candidates}["b"].reason


def test_the_choice_follows_each_questions_expected_lengths():
    """Two candidates as likely right; each writes briefly on one question and at length on the
    other: with a cost weight, each question runs the one that will answer it cheaply."""
    costs = {c: Estimate(400, 1.0, 400.0, 40.0, c) for c in ("a", "b")}
    p = {"a": 0.7, "b": 0.7}
    cheap = rule(k=1, weights={"performance": 1.0, "cost": 0.5})
    one = choose(p, costs, cheap, ["a", "b"], {"a": 50.0, "b": 380.0})
    two = choose(p, costs, cheap, ["a", "b"], {"a": 390.0, "b": 40.0})
    assert one.chosen == ["a"] and two.chosen == ["b"]
    by = {c.id: c for c in one.candidates}
    assert by["a"].tokens == 50.0 and by["a"].cost_share == pytest.approx(50 / 400)
    # Never above the cap; no prediction: the cap (the old, per-config estimate).
    capped = choose(p, costs, cheap, ["a", "b"], {"a": 9999.0, "b": None})
    assert {c.id: c.tokens for c in capped.candidates} == {"a": 400.0, "b": 400.0}
    fast = rule(k=1, weights={"performance": 1.0, "latency": 0.5})
    assert choose(p, costs, fast, ["a", "b"], {"a": 390.0, "b": 40.0}).chosen == ["b"]


def test_one_scorer_routes_questions_of_two_domains_differently():
    """A scorer whose candidates are each strong on one direction of the embedding (a domain)
    picks by the question, end to end through Scorer.predict and choose; a static router (the
    same set for both) fails this."""
    from routing.scorer_file import CandidateModel, LengthModel, Scorer

    def model(axis: int, tokens_axis: int) -> CandidateModel:
        coef = [0.0] * 4
        coef[axis] = 6.0
        length = [0.0] * 4
        length[tokens_axis] = 1.0
        return CandidateModel(
            coef=coef,
            intercept=-1.0,
            prior=0.5,
            positives=5,
            examples=10,
            length=LengthModel(coef=length, intercept=4.0, median_tokens=60, examples=10),
        )

    scorer = Scorer(embedder="e", dim=4, candidates={"coder": model(0, 2), "math": model(1, 3)})
    code_q, math_q = np.array([1.0, 0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0, 0.0])
    costs = {c: Estimate(400, 1.0, 400.0, None, c) for c in ("coder", "math")}
    picks = []
    for q in (code_q, math_q):
        lengths = scorer.predict_tokens(q)
        picks.append(choose(scorer.predict(q), costs, rule(k=1), ["coder", "math"], lengths).chosen)
    assert picks == [["coder"], ["math"]]
    assert scorer.predict_tokens(code_q)["coder"] == pytest.approx(np.expm1(4.0))


def test_the_shipped_routed_config_sends_code_to_the_coder_and_instructions_elsewhere():
    """routed_pool_cpu as shipped (its scorer, its threshold, the real MiniLM), on questions its
    scorer never saw (the mix past its 40 training questions): most code questions run a
    Qwen2.5-Coder candidate, few instruction-following ones do. A router that went
    static, or a scorer that stopped separating the domains, fails this."""
    from experiments.datasets import load_questions
    from experiments.prompts import build_question_prompt
    from router.embedder import Embedder
    from routing.estimates import estimate_pool
    from routing.query_embedding import query_embeddings

    cfg = load_config("routed_pool_cpu")
    scorer = load_scorer(cfg, "t")
    qs = load_questions("humaneval,ifbench", 16, None, 0, 40)
    x = query_embeddings(
        Embedder(cfg.early_exit.embedding_model), [build_question_prompt(q) for q in qs]
    )
    estimates = estimate_pool(cfg)
    chose_coder = {"humaneval": [], "ifbench": []}
    for q, e in zip(qs, x, strict=True):
        d = choose(
            scorer.predict(e), estimates, cfg.routing, cfg.pool_ids, scorer.predict_tokens(e)
        )
        chose_coder[q.dataset].append(any(cfg.agent(c).model == "qwen2.5-coder" for c in d.chosen))
    assert len(chose_coder["humaneval"]) == len(chose_coder["ifbench"]) == 8
    # On these 16 it chose the coder for 6 code questions and 0 others (stop 52); a static set
    # gives 8 and 8 or 0 and 0.
    assert sum(chose_coder["humaneval"]) >= 6, chose_coder
    assert sum(chose_coder["ifbench"]) <= 2, chose_coder


# --- posterior correction -----------------------------------------------------------------------
def answer(agent: str, logprob: float, direction: int) -> AgentResult:
    emb = np.zeros((3, 4), np.float32)
    emb[:, direction] = [1.0, 2.0, 3.0]
    emb[:, 3] = [3.0, 1.0, 2.0]
    return AgentResult(agent, [logprob] * 5, emb)


def test_posterior_scores_confidence_and_agreement_and_names_the_low_answers():
    from router.config import PosteriorCorrection

    answers = [answer("a", -0.1, 0), answer("b", -0.2, 0), answer("c", -3.0, 1)]
    d = correct("final", answers, {"a": 0.5, "b": 0.5, "c": 0.5}, PosteriorCorrection())
    assert d.low == ["c"]
    s = d.scores
    assert s["a"]["agreement"] > s["c"]["agreement"] and s["a"]["confidence"] > s["c"]["confidence"]
    assert d.to_record()["low"] == ["c"]
    # Without the prior's weight, and a lone answer: nothing to compare, nothing low.
    lone = correct("final", answers[:1], {}, PosteriorCorrection(prior_weight=0.0))
    assert lone.low == [] and lone.scores["a"]["agreement"] is None


# --- a routed question on fake workers ----------------------------------------------------------
class FakeEmbeddings:
    """EmbeddingService's interface; the query's vector leans on dimension 0, answers differ."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def embed(self, text: str):
        self.texts.append(text)
        rng = np.random.default_rng(len(text))
        return rng.normal(size=(4, 384)).astype(np.float32) + 0.5, 0.001


@pytest.fixture
def routed(tmp_path):
    """(config factory) with a 4-candidate scorer cut from the fixture in tmp_path."""
    doc = json.loads(FIXTURE_SCORER.read_text())
    ids = list(doc["candidates"])
    doc["candidates"] = {f"c{i}": doc["candidates"][ids[i]] for i in range(4)}
    (tmp_path / "s.json").write_text(json.dumps(doc))

    def make(k: int = 2, posterior: dict | None = None):
        raw = pooled(4, k=k, scorer=str(tmp_path / "s.json"))
        raw["sampling"] = {"max_new_tokens": 6, "temperature": 0.0}
        # Answers of 2, 4, 6, 8 tokens: the fake model's logprobs fall with the position, so
        # their confidences differ (the shortest is the surest).
        for i, c in enumerate(raw["pool"]["candidates"]):
            c["sampling"] = {"max_new_tokens": 2 + 2 * i}
        if posterior:
            raw["routing"]["posterior_correction"] = posterior
        return parse_config(json.dumps(raw))

    return make


def final_prompt(cluster, rid_part: str = "-final-") -> list[int]:
    (req,) = [r for r in cluster.prefills[0].finals() if rid_part in r["rid"]]
    return req["input_ids"]


async def test_a_routed_question_runs_only_the_chosen_and_records_why(
    smollm_tokenizer_path,  # noqa: F811
    routed,
):
    cfg = routed(k=2)
    emb = FakeEmbeddings()
    routers = PoolRouters(lambda name: emb)
    fast = {"decode": {"token_delay_s": 0.001}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **fast)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            for mode in ("pipelined", "blocking"):
                s = Session(ctx, cfg, "What is 2+3?", mode, route=routers(cfg))
                result = await s.run_all()
                chosen = result.routing["chosen"]
                assert len(chosen) == 2 and set(chosen) < set(cfg.pool_ids)
                assert set(result.routing["candidates"]) == set(cfg.pool_ids)
                assert 0 < result.routing["wall_s"] and result.routing["embed_s"] == 0.001
                for c in cfg.pool_ids:
                    t = result.trace[c]
                    assert t["routed_out"] == t["skipped"] == (c not in chosen)
                    assert bool(t["output_ids"]) == (c in chosen)
                assert result.trace["final"]["slot_order"] == chosen
                decode = cluster.decodes[0]
                sent = {r["rid"].split("-")[2] for r in decode.requests} - {"final"}
                assert sent == set(chosen)  # the others never reached a worker
                decode.requests.clear()
            tok = ctx.tokenizer("smollm2")
            text = tok.tok.decode(cluster.prefills[0].finals()[-1]["input_ids"])
            assert "[Candidate 2]" in text and "[Candidate 3]" not in text
    finally:
        await cluster.close()


@pytest.mark.parametrize("action", ["drop", "last"])
async def test_posterior_correction_drops_or_orders_last(
    smollm_tokenizer_path,  # noqa: F811
    routed,
    action,
):
    # Every prior equal and no agreement: the confidence alone decides; a cutoff of 1.0 makes
    # every answer but the best low.
    posterior = {
        "enabled": True,
        "action": action,
        "prior_weight": 0.0,
        "agreement_weight": 0.0,
        "relative_cutoff": 1.0,
    }
    cfg = routed(k=3, posterior=posterior)
    emb = FakeEmbeddings()
    routers = PoolRouters(lambda name: emb)
    fast = {"decode": {"token_delay_s": 0.001}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **fast)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            orders = []
            for mode in ("pipelined", "blocking"):
                s = Session(
                    ctx,
                    cfg,
                    "Name a prime.",
                    mode,
                    route=routers(cfg),
                    posterior=routers.posterior(cfg),
                )
                result = await s.run_all()
                (rec,) = result.posterior
                chosen = result.routing["chosen"]
                assert set(rec["scores"]) == set(chosen) and rec["action"] == action
                best = max(chosen, key=lambda c: rec["scores"][c]["score"])
                assert set(rec["low"]) == set(chosen) - {best}
                order = result.trace["final"]["slot_order"]
                if action == "drop":
                    assert order == [best]
                else:
                    assert order[0] == best and order[1:] == list(reversed(rec["low"]))
                orders.append((order, final_prompt(cluster)))
                cluster.prefills[0].requests.clear()
            assert orders[0] == orders[1]  # pipelined and blocking build the same prompt
    finally:
        await cluster.close()


# --- setting #6 in the summary ------------------------------------------------------------------
def test_setting_6_in_the_summary_table_and_figure(tmp_path):
    from rich.console import Console
    from synthetic_results import ROUTED_OUT, ROUTING_WALL_S, make_rows

    from experiments.figures import plot_work
    from experiments.results import validate_row
    from experiments.settings import SETTINGS, parse_settings
    from experiments.summary import summarize
    from experiments.summary_table import build_table

    assert parse_settings("4,6")[1] == SETTINGS[6] and SETTINGS[6].topology == "routed"
    assert SETTINGS[6].mode == "pipelined" and SETTINGS[6].early_exit
    rows = [validate_row(r) for r in make_rows(datasets=("gsm8k",), settings=(3, 4, 6), n=6)]
    by = {s.setting: s for s in summarize(rows)}
    routed, full = by[6], by[3]
    assert full.models_run_mean == 13 and routed.models_run_mean == 13 - len(ROUTED_OUT)
    assert routed.proposer_tokens_mean == 3 * (9 - len(ROUTED_OUT)) < full.proposer_tokens_mean
    e2e = sum(r.e2e_s for r in rows if r.setting == 6)
    assert routed.routing_share == pytest.approx(6 * ROUTING_WALL_S / e2e)
    assert full.routing_share is None
    assert routed.paired["vs_4"]["questions"] == 6 and "mcnemar_p" in routed.paired["vs_4"]
    console = Console(record=True, width=260)
    console.print(build_table(summarize(rows)))
    text = console.export_text()
    assert "#6" in text and "models/q" in text and "vs #4" in text
    assert plot_work(rows, tmp_path / "w.png").exists()
    assert plot_work([r for r in rows if r.setting != 6], tmp_path / "x.png") is None


# --- through the HTTP API, and on the real engine -----------------------------------------------
async def test_http_run_returns_the_routing_record_and_refuses_a_missing_scorer(
    smollm_tokenizer_path,  # noqa: F811
    routed,
    tmp_path,
):
    from aiohttp.test_utils import TestClient, TestServer

    from router.api_request import CONFIGS, ROUTERS
    from router.server import make_app

    cfg = routed(k=2, posterior={"enabled": True, "action": "drop"})
    raw = cfg.model_dump(mode="json") | {"name": "no_scorer"}
    raw["routing"]["scorer"] = str(tmp_path / "missing.json")
    broken = parse_config(json.dumps(raw))
    fast = {"decode": {"token_delay_s": 0.001}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **fast)
    app = make_app(cluster.spec, {cfg.name: cfg, broken.name: broken})
    # The files the router loaded at start (the missing one: why it could not).
    app[ROUTERS] = PoolRouters(lambda name: FakeEmbeddings(), app[CONFIGS].files)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        r = await client.post("/v1/moa/run", json={"question": "2+2?", "config": cfg.name})
        assert r.status == 200, await r.text()
        out = await r.json()
        assert len(out["routing"]["chosen"]) == 2 and len(out["posterior"]) == 1
        assert sum(t["routed_out"] for t in out["trace"].values()) == 2
        r = await client.post("/v1/moa/run", json={"question": "2+2?", "config": broken.name})
        assert r.status == 400
        assert "routing.scorer: cannot read" in (await r.json())["message"]
    finally:
        await client.close()
        await cluster.close()


@pytest.mark.slow
async def test_a_routed_question_on_the_real_engine(stack, routed):
    """The real MiniLM embeds the query and the answers; the reference engine runs the chosen
    proposers, with early exit and posterior correction on the chosen set."""
    from router.config import EarlyExit
    from router.early_exit_hook import EarlyExitHooks
    from tests.router_fixtures import stack_cluster

    cfg = routed(k=3, posterior={"enabled": True, "action": "last"})
    cfg = cfg.model_copy(update={"early_exit": EarlyExit(enabled=True, min_completed=2)})
    hooks = EarlyExitHooks()
    routers = PoolRouters(hooks.embedding)
    try:
        async with RouterContext.open(stack_cluster(stack)) as ctx:
            s = Session(
                ctx,
                cfg,
                "What is 7 times 8?",
                "pipelined",
                on_completion=hooks(cfg),
                route=routers(cfg),
                posterior=routers.posterior(cfg),
            )
            result = await s.run_all()
    finally:
        hooks.close()
    chosen = result.routing["chosen"]
    assert len(chosen) == 3 and result.routing["embed_s"] > 0
    for d in result.early_exit:
        assert set(d["completed"]) <= set(chosen) and set(d["killed"]) <= set(chosen)
    (rec,) = result.posterior
    assert set(rec["scores"]) <= set(chosen) and rec["scores"]
    assert set(result.trace["final"]["slot_order"]) == set(rec["scores"])
    assert result.answer


def test_estimates_use_declared_sizes_and_speeds_and_name_what_is_missing():
    from routing.estimates import estimate_pool

    raw = pooled(2, model_sizes_b={"smollm2": 0.5}, decode_tokens_per_s={"smollm2": 50.0})
    raw["pool"]["candidates"][1]["sampling"] = {"max_new_tokens": 200}
    raw["sampling"] = {"max_new_tokens": 100}
    est = estimate_pool(parse_config(json.dumps(raw)), "t")
    assert est["c0"].cost == pytest.approx(50.0) and est["c1"].cost == pytest.approx(100.0)
    assert est["c1"].latency_s == pytest.approx(4.0)
    raw = pooled(2, model_sizes_b={"smollm2": 0.5}, weights={"latency": 1.0})
    with pytest.raises(ConfigError, match=r"routing.decode_tokens_per_s: .*'smollm2' has no"):
        estimate_pool(parse_config(json.dumps(raw)), "t")


def test_a_router_is_loaded_once_per_routing_and_none_without_it(routed):
    from router.api_request import with_final_sampling

    cfg = routed(k=2)
    routers = PoolRouters(lambda name: FakeEmbeddings())
    first = routers(cfg)
    assert routers(with_final_sampling(cfg, {"max_new_tokens": 3})) is first
    other = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"k": 1})})
    assert routers(other) is not first and routers.posterior(cfg) is None
    assert routers(load_config("tree_3_1_cpu")) is None
