"""`moa-pd train-scorer` on synthetic setting-#5 rows and small random embeddings (injected in
place of MiniLM): a signal in the embedding is learned, held-out questions never reach the fit
they judge, the file round-trips through Scorer.predict, bad runs get clear errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from launch.cli import build_parser
from routing.outcomes import Outcomes, OutcomesError, read_outcomes
from routing.scorer_file import Scorer
from routing.train import (
    TrainOptions,
    fit_candidate,
    heldout_metrics,
    split_questions,
    train_scorer,
)
from routing.train_cmd import main
from tests.text_checks import said

N, DIM = 160, 8


def _data(seed: int = 0):
    """x[i] random; 'strong' is right when x0 (plus a little noise) is positive, 'coin' at
    random with p 0.4."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, DIM))
    strong = (x[:, 0] + 0.3 * rng.normal(size=N) > 0).astype(float)
    coin = (rng.random(N) < 0.4).astype(float)
    return x, np.stack([strong, coin], axis=1)


def _outcomes(y: np.ndarray) -> Outcomes:
    keys = [("toy", f"q{i}") for i in range(len(y))]
    return Outcomes(keys, ["strong", "coin"], y, ["run"], 0)


def test_a_signal_in_the_embedding_is_learned_and_the_file_round_trips(tmp_path):
    x, y = _data()
    scorer = train_scorer(_outcomes(y), x, TrainOptions(heldout_fraction=0.3, seed=1))
    strong = scorer.heldout["strong"]
    assert strong["auc"] > 0.85 and strong["auc_lo"] > 0.6
    # The prior's Brier score by hand: the training questions' rate, scored on the held-out ones.
    train, held = split_questions(N, 0.3, seed=1)
    prior = y[train, 0].mean()
    assert strong["prior"] == pytest.approx(prior)
    assert strong["brier_prior"] == pytest.approx(np.mean((prior - y[held, 0]) ** 2))
    assert strong["brier"] < strong["brier_prior"] and strong["brier_gain_lo"] > 0
    assert strong["n"] == 48 and scorer.candidates["strong"].examples == N
    assert scorer.candidates["coin"].positives == int(y[:, 1].sum())
    path = tmp_path / "scorer.json"
    scorer.dump(path)
    loaded = Scorer.load(path)
    assert loaded == scorer
    p = [loaded.predict(x[i])["strong"] for i in range(N)]
    assert np.mean((np.asarray(p) > 0.5) == y[:, 0]) > 0.85
    # The file's weights are the refit on every question, with the held-out fit's strength.
    final = fit_candidate(x, y[:, 0], 1, c=strong["c"])
    assert p == pytest.approx(final.predict_proba(x)[:, 1], abs=1e-9)


def test_held_out_questions_never_reach_the_fit_they_judge():
    x, y = _data(2)
    train, held = split_questions(N, 0.25, seed=7)
    assert not set(train) & set(held) and len(train) + len(held) == N
    scorer = train_scorer(_outcomes(y), x, TrainOptions(heldout_fraction=0.25, seed=7))
    assert scorer.trained_on["heldout_questions"] == [["toy", f"q{i}"] for i in held]
    # The reported numbers are those of a fit on the training questions alone.
    alone = fit_candidate(x[train], y[train, 0], 7)
    want = heldout_metrics(y[held, 0], alone.predict_proba(x[held])[:, 1], y[train, 0].mean(), 7)
    got = scorer.heldout["strong"]
    assert {k: got[k] for k in want} == pytest.approx(want)
    # Labels flipped on the held-out questions only change nothing the fit saw: same strength.
    y2 = y.copy()
    y2[held, 0] = 1 - y2[held, 0]
    flipped = train_scorer(_outcomes(y2), x, TrainOptions(heldout_fraction=0.25, seed=7))
    assert flipped.heldout["strong"]["c"] == got["c"]
    assert flipped.heldout["strong"]["auc"] == pytest.approx(1 - got["auc"])


def test_one_class_is_refused_with_the_fix_that_helps():
    # train_scorer is the one place that checks: all answers of one class (no split helps) ...
    x, _ = _data(5)
    keys = [("toy", f"q{i}") for i in range(N)]
    bad = np.zeros(N)
    bad[:2] = np.nan  # ungraded questions do not count
    opts = TrainOptions(heldout_fraction=0.25, seed=3)
    with pytest.raises(OutcomesError, match=r"'bad' has no correct answers among its 158 graded"):
        train_scorer(Outcomes(keys, ["bad"], bad[:, None], ["run"], 0), x, opts)
    # ... or both classes, but one only in the held-out questions: another split may do.
    _, held = split_questions(N, 0.25, seed=3)
    bad[held[0]] = 1.0
    with pytest.raises(OutcomesError, match=r"hold 0 correct answers .* --seed / --heldout"):
        train_scorer(Outcomes(keys, ["bad"], bad[:, None], ["run"], 0), x, opts)


def _write_run(path, rows, tokens=None):
    """Setting-#5 rows (sample, setting, candidate, correct); `tokens(sample, candidate)`: the
    output tokens its agent wrote (none recorded without it)."""
    path.mkdir(parents=True, exist_ok=True)
    lines = []
    for sample, setting, cand, correct in rows:
        row = {
            "sample_id": sample,
            "dataset": "toy",
            "setting": setting,
            "single_model": cand,
            "correct": correct,
            "e2e_s": 1.0,
        }
        if tokens is not None and cand is not None:
            row["agents"] = {cand: {"model": "m", "output_ids": [7] * tokens(sample, cand)}}
        lines.append(json.dumps(row))
    (path / "results.jsonl").write_text("\n".join(lines) + "\n")
    return path


def _cli(tmp_path, *runs, extra=()):
    questions = tmp_path / "toy.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"question {i}"}) + "\n" for i in range(N))
    )
    out = tmp_path / "scorer.json"
    argv = ["train-scorer", "--results", *map(str, runs), "--out", str(out)]
    argv += ["--questions", str(questions), *extra]
    return build_parser(["train-scorer"]).parse_args(argv), out


def _embed(x):
    """The injected embedder: question i's prompt → x[i]."""
    return lambda texts: np.stack([x[int(re.search(r"question (\d+)", t)[1])] for t in texts])


def test_train_scorer_command_end_to_end(tmp_path, capsys):
    x, y = _data(3)
    rows = [(f"q{i}", 5, c, bool(y[i, j])) for i in range(N) for j, c in enumerate(["a", "b"])]
    rows += [("q0", 5, "a", None), ("q1", 2, None, True)]  # a failed #5 row, a MoA row

    # a writes long answers where x1 is large, b about 40 tokens whatever the question.
    def tokens(sample: str, cand: str) -> int:
        i = int(sample[1:])
        return int(np.exp(4.0 + 0.8 * x[i, 1])) if cand == "a" else 38 + i % 5

    run = _write_run(tmp_path / "run1", rows, tokens)
    args, out = _cli(tmp_path, run)
    assert main(args, _embed(x)) == 0
    scorer = Scorer.load(out)
    assert set(scorer.candidates) == {"a", "b"} and scorer.dim == DIM
    assert scorer.trained_on["ungraded_rows_skipped"] == 1
    assert scorer.heldout["a"]["auc"] > 0.8
    # The length model: far better than the median where length follows the query, and near
    # the median where it does not.
    a, b = scorer.heldout["a"], scorer.heldout["b"]
    assert a["length_median_error_tokens"] < 0.3 * a["length_median_error_of_median"]
    assert b["length_median_error_tokens"] < 3.0
    long_q, short_q = int(np.argmax(x[:, 1])), int(np.argmin(x[:, 1]))
    assert scorer.predict_tokens(x[long_q])["a"] > 3 * scorer.predict_tokens(x[short_q])["a"]
    # Refit on every graded answer: q0's failed row (the later) replaced its graded one.
    assert scorer.candidates["a"].length.examples == scorer.candidates["a"].examples == N - 1
    printed = capsys.readouterr()
    assert "held-out" in printed.out and "refit on all 160" in printed.err
    # Runs that recorded no output ids train no length model: routing then uses the caps.
    bare = _write_run(tmp_path / "bare", rows)
    args, out = _cli(tmp_path, bare)
    assert main(args, _embed(x)) == 0
    assert Scorer.load(out).predict_tokens(x[0]) == {"a": None, "b": None}


def _not_embedded(texts):
    raise AssertionError("embedded questions of a run that cannot train a scorer")


def test_train_scorer_errors_name_the_problem(tmp_path, capsys):
    x, y = _data(4)
    moa_only = _write_run(tmp_path / "moa", [(f"q{i}", 2, None, True) for i in range(N)])
    args, _ = _cli(tmp_path, moa_only)
    assert main(args, _embed(x)) == 2
    assert "no graded setting-#5 rows" in said(capsys.readouterr().err)

    never = [(f"q{i}", 5, "a", bool(y[i, 0])) for i in range(N)]
    never += [(f"q{i}", 5, "hopeless", False) for i in range(N)]
    run = _write_run(tmp_path / "never", never)
    args, _ = _cli(tmp_path, run)
    assert main(args, _not_embedded) == 2  # refused before the questions are embedded
    err = said(capsys.readouterr().err)
    assert "'hopeless' has no correct answers" in err and "--skip-candidate" in err
    args, out = _cli(tmp_path, run, extra=["--skip-candidate", "hopeless"])
    assert main(args, _embed(x)) == 0 and list(Scorer.load(out).candidates) == ["a"]

    args, _ = _cli(tmp_path, tmp_path / "nowhere")
    assert main(args, _embed(x)) == 2
    assert "no such results file" in said(capsys.readouterr().err)
    torn = tmp_path / "torn"
    _write_run(torn, never[:3])
    (torn / "results.jsonl").write_text("{oops\n" + (torn / "results.jsonl").read_text())
    with pytest.raises(ValueError, match=r"results.jsonl:1: not valid JSON"):
        read_outcomes([torn])


def test_the_scorer_is_judged_as_a_router_against_the_oracle_and_the_prior():
    # Two specialists: 'left' is right where x0 < 0, 'right' where x0 > 0; the prior (the better
    # on average) is one of them whatever the question: a router that follows x0 beats it.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, DIM))
    left = (x[:, 0] < 0).astype(float)
    right = ((x[:, 0] > 0) & (rng.random(N) < 0.9)).astype(float)
    y = np.stack([left, right], axis=1)
    outcomes = Outcomes([("toy", f"q{i}") for i in range(N)], ["left", "right"], y, ["run"], 0)
    scorer = train_scorer(outcomes, x, TrainOptions(heldout_fraction=0.3, seed=1))
    r = scorer.heldout_router
    assert r["questions"] == 48 and r["distinct_picks"] == 2
    assert r["top1_hit_rate"] > 0.9 and r["regret"] < 0.06
    assert r["prior_hit_rate"] < 0.65 and r["prior_regret"] > 0.3
    assert r["oracle_accuracy"] == pytest.approx(r["top1_accuracy"] + r["regret"])
    # By hand for a tiny case: question 0 only B right, question 1 both, question 2 none.
    from routing.train import router_metrics

    correct = np.array([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    p = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    m = router_metrics(correct, p, np.array([0.7, 0.3]), ["A", "B"])
    assert m["top1_accuracy"] == pytest.approx(1 / 3) and m["oracle_accuracy"] == pytest.approx(
        2 / 3
    )
    assert m["top1_hit_rate"] == pytest.approx(0.5) and m["prior_candidate"] == "A"
    assert m["prior_top1_accuracy"] == pytest.approx(1 / 3) and m["distinct_picks"] == 2
