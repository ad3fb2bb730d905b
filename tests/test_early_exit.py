"""Early exit's Q metric against a float64 reference that forms the h×h correlation matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from router.config import EarlyExit
from router.early_exit import (
    RECORD_KEYS,
    AgentResult,
    SimilarityCache,
    activation_percentage,
    aggregate_confidence,
    agreement,
    calibration,
    confidence,
    decide,
    draw,
    fcs,
    q_score,
    self_norm,
    unit_columns,
)


# --- the reference: the paper's formulas taken literally ---------------------------------------
def ref_corr(t: np.ndarray) -> np.ndarray:
    u = t.astype(np.float64).T @ t.astype(np.float64)
    d = np.sqrt(np.maximum(np.diag(u), 1e-24))
    return u / np.outer(d, d)


def ref_fcs(t_i: np.ndarray, t_j: np.ndarray) -> float:
    a, b = ref_corr(t_i), ref_corr(t_j)
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def ref_q(embs, logprobs, tau=0.7, diag=True, power=None):
    c = [math.exp(sum(lp) / len(lp)) for lp in logprobs]
    c_bar = math.sqrt(sum(x * x for x in c) / len(c))
    num = den = 0.0
    for i in range(len(embs)):
        for j in range(i + 1 if diag else i):
            sim = 1.0 if i == j else ref_fcs(embs[i], embs[j])
            num += c[i] * c[j] * sim
            den += c[i] * c[j]
    p = num / den
    b = 1 - abs(p - tau) / tau
    return c_bar, p, b, math.sqrt(c_bar * b) ** (tau if power is None else power)


def agents(embs, logprobs, answers=None):
    answers = answers or [None] * len(embs)
    return [
        AgentResult(f"a{i}", lp, e, ans)
        for i, (e, lp, ans) in enumerate(zip(embs, logprobs, answers))
    ]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# --- FCS --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_i,n_j,h", [(1, 1, 8), (3, 17, 16), (40, 5, 64), (70, 90, 32)])
def test_fcs_matches_reference(rng, n_i, n_j, h):
    # A shared mean direction makes the matrices correlated, as real embeddings are.
    base = rng.normal(size=h)
    t_i = rng.normal(size=(n_i, h)) + base
    t_j = rng.normal(size=(n_j, h)) * 2.0 + base
    s_i, s_j = unit_columns(t_i), unit_columns(t_j)
    got = fcs(s_i, s_j, self_norm(s_i), self_norm(s_j))
    assert got == pytest.approx(ref_fcs(t_i, t_j), rel=1e-10, abs=1e-12)
    assert 0.0 <= got <= 1.0


def test_fcs_properties(rng):
    t = rng.normal(size=(12, 24)).astype(np.float32)
    s = unit_columns(t)
    assert fcs(s, s, self_norm(s), self_norm(s)) == pytest.approx(1.0, abs=1e-12)
    # Corr removes per-feature scale: scaling columns of T leaves FCS unchanged.
    s2 = unit_columns(t * rng.uniform(0.1, 10.0, size=24))
    assert fcs(s, s2, self_norm(s), self_norm(s2)) == pytest.approx(1.0, abs=1e-12)


def test_zero_columns_and_empty_outputs(rng):
    t = rng.normal(size=(6, 10))
    t[:, 3] = 0.0
    u = rng.normal(size=(4, 10))
    s_t, s_u = unit_columns(t), unit_columns(u)
    assert fcs(s_t, s_u, self_norm(s_t), self_norm(s_u)) == pytest.approx(ref_fcs(t, u), rel=1e-10)
    empty = unit_columns(np.zeros((0, 10)))
    assert fcs(empty, s_u, self_norm(empty), self_norm(s_u)) == 0.0
    with pytest.raises(ValueError, match="n_tokens, hidden"):
        unit_columns(np.zeros(10))


# --- C, C̄, P, B, Q ----------------------------------------------------------------------------
def test_confidence_and_rms():
    assert confidence([math.log(0.5)] * 4) == pytest.approx(0.5)
    assert confidence([math.log(0.25), 0.0]) == pytest.approx(0.5)
    assert confidence([]) == 0.0
    assert aggregate_confidence([0.6, 0.8]) == pytest.approx(math.sqrt((0.36 + 0.64) / 2))


@pytest.mark.parametrize("p,b", [(0.0, 0.0), (0.5, 0.714), (0.7, 1.0), (0.9, 0.714), (1.0, 0.571)])
def test_calibration_table(p, b):
    assert calibration(p, 0.7) == pytest.approx(b, abs=1e-3)


@pytest.mark.parametrize("form,q", [("tau", 0.792), ("none", 0.717), ("inverse_tau", 0.622)])
def test_exponent_forms(form, q):
    # paper-notes §3.3: C̄ = 0.9, P = 1 (B = 0.571).
    assert q_score(0.9, calibration(1.0, 0.7), 0.7, form) == pytest.approx(q, abs=1e-3)
    with pytest.raises(ValueError, match="exponent"):
        q_score(0.9, 0.5, 0.7, "square")


@pytest.mark.parametrize("diag", [True, False])
@pytest.mark.parametrize("form,power", [("tau", 0.7), ("none", 1.0), ("inverse_tau", 1 / 0.7)])
def test_decide_matches_reference(rng, diag, form, power):
    h = 48
    base = rng.normal(size=h)
    embs = [rng.normal(size=(n, h)) + base * k for n, k in [(20, 1.0), (7, 3.0), (33, 0.5)]]
    logprobs = [list(-rng.exponential(0.3, size=n)) for n in (20, 7, 33)]
    cfg = EarlyExit(enabled=True, include_diagonal=diag, exponent=form)
    d = decide("agg", agents(embs, logprobs), ["a0", "a1", "a2", "a3"], cfg, "q17")
    c_bar, p, b, q = ref_q(embs, logprobs, diag=diag, power=power)
    assert (d.c_bar, d.p, d.b, d.q) == pytest.approx((c_bar, p, b, q), rel=1e-9)
    assert d.exited == (d.u < d.q)
    assert d.killed == (["a3"] if d.exited else [])


def test_diagonal_changes_p(rng):
    embs = [rng.normal(size=(9, 16)) for _ in range(2)]
    done = agents(embs, [[-0.1] * 9, [-0.2] * 9])
    with_diag, without = agreement(done, True), agreement(done, False)
    assert without == pytest.approx(ref_fcs(*embs), rel=1e-10)
    assert with_diag > without  # the diagonal adds Sim = 1 terms
    assert agreement(done[:1], False) == 0.0  # no pairs: no evidence of agreement


def test_cache_reuses_pairs(rng):
    embs = [rng.normal(size=(5, 8)) for _ in range(3)]
    done = agents(embs, [[-0.1] * 5] * 3)
    cache = SimilarityCache()
    first = agreement(done[:2], True, cache)
    assert agreement(done[:2], True, cache) == first
    assert agreement(done, True, cache) == pytest.approx(agreement(done, True), rel=1e-12)


# --- decide -----------------------------------------------------------------------------------
def test_min_completed_blocks_exit(rng):
    done = agents([rng.normal(size=(4, 8))], [[-0.01] * 4])
    d = decide("agg", done, ["a0", "a1", "a2"], EarlyExit(enabled=True), "q")
    assert (d.exited, d.q, d.u, d.killed) == (False, None, None, [])
    d1 = decide("agg", done, ["a0", "a1", "a2"], EarlyExit(enabled=True, min_completed=1), "q")
    assert d1.q is not None and d1.p == 1.0


def test_record_keys_and_nothing_left(rng):
    embs = [rng.normal(size=(4, 8)) for _ in range(2)]
    d = decide("agg", agents(embs, [[-0.01] * 4] * 2), ["a0", "a1"], EarlyExit(), "q")
    record = d.to_record()
    assert tuple(record) == RECORD_KEYS
    assert record["q"] is not None and record["exited"] is False  # nobody left to kill
    assert record["completed"] == ["a0", "a1"] and record["seconds"] >= 0.0


def test_bad_inputs(rng):
    with pytest.raises(ValueError, match="not in cluster"):
        decide("agg", agents([rng.normal(size=(2, 4))], [[-1.0]]), ["x"], EarlyExit(), "q")
    with pytest.raises(ValueError, match="no embedding"):
        decide(
            "agg",
            [AgentResult("a", [-1.0]), AgentResult("b", [-1.0])],
            ["a", "b", "c"],
            EarlyExit(),
            "q",
        )


def test_draws_are_reproducible_and_keyed():
    u = draw(0, "q1", "agg0", 2)
    assert u == draw(0, "q1", "agg0", 2) and 0.0 <= u < 1.0
    others = {
        draw(1, "q1", "agg0", 2),
        draw(0, "q2", "agg0", 2),
        draw(0, "q1", "agg1", 2),
        draw(0, "q1", "agg0", 3),
    }
    assert u not in others and len(others) == 4
    us = np.array([draw(0, f"q{i}", "c", 2) for i in range(2000)])
    assert abs(us.mean() - 0.5) < 0.03  # roughly uniform


def test_exit_rate_follows_q(rng):
    # Identical confident outputs: P = 1, B = 0.571, Q = 0.79 with the default exponent.
    t = rng.normal(size=(6, 8))
    done = agents([t, t], [[-0.105] * 6] * 2)
    cfg = EarlyExit(enabled=True)
    exits = [decide("c", done, ["a0", "a1", "a2"], cfg, f"q{i}").exited for i in range(600)]
    q = decide("c", done, ["a0", "a1", "a2"], cfg, "x").q
    assert np.mean(exits) == pytest.approx(q, abs=0.06)


def test_dmv_decisions():
    cfg = EarlyExit(enabled=True, method="dmv")
    planned = ["a", "b", "c"]
    two = [AgentResult("a", [-1.0], answer="18"), AgentResult("b", [-1.0], answer="18.0")]
    d = decide("agg", two, planned, cfg, "q")
    assert d.exited and d.killed == ["c"] and d.q == pytest.approx(2 / 3) and d.u is None
    split = [AgentResult("a", [-1.0], answer="18"), AgentResult("b", [-1.0], answer="17")]
    assert not decide("agg", split, planned, cfg, "q").exited
    # 2 of 4 planned is no strict majority.
    assert not decide("agg", two, planned + ["d"], cfg, "q").exited


# --- activation ---------------------------------------------------------------------------------
def test_activation_percentage():
    def entry(model, killed=False):
        return {"model": model, "killed": killed, "output_ids": [1, 2]}

    traces = [
        {"a": entry("4b"), "b": entry("32b", killed=True), "c": entry("4b")},
        {"a": entry("4b"), "b": entry("32b"), "c": entry("4b", killed=True)},
    ]
    assert activation_percentage(traces) == {"4b": 75.0, "32b": 50.0}
    # A bypassed agent has no entry; the config's agent list still counts it as planned.
    models = {"a": "4b", "b": "32b", "c": "4b", "root": "32b"}
    assert activation_percentage(traces, models) == {"4b": 75.0, "32b": 25.0}
    assert activation_percentage([]) == {}
