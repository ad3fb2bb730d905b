"""Fit the proposer scorer: per pool candidate a logistic regression from the query embedding to
"answers correctly", judged on held-out questions against the training prior, then refit on
every question for the file (`moa-pd train-scorer`; the file format is routing/scorer_file.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata
from sklearn.linear_model import LogisticRegression, Ridge, RidgeCV
from sklearn.metrics import brier_score_loss, roc_auc_score
from sklearn.model_selection import GridSearchCV, StratifiedKFold, train_test_split

from routing.outcomes import Outcomes, OutcomesError
from routing.scorer_file import CandidateModel, LengthModel, Scorer

# Inverse L2 strengths tried by cross-validation on the training questions: unit-length
# embeddings need weak regularization to move at all, few positives need strong.
CS = np.logspace(-2, 3, 6)
# Ridge strengths tried for the length model, and the fewest answers with tokens it needs.
ALPHAS = np.logspace(-3, 3, 7)
MIN_LENGTH_EXAMPLES = 10
BOOTSTRAP = 1000


@dataclass(frozen=True)
class TrainOptions:
    heldout_fraction: float = 0.25
    seed: int = 0
    embedder: str = "all-minilm-l6-v2"


def fit_candidate(x: np.ndarray, y: np.ndarray, seed: int, c: float | None = None):
    """An L2 logistic regression, its strength chosen by 3-fold stratified CV on log loss unless `c`
    is given. Not class-balanced: the router weighs the probability against cost, so it must
    stay calibrated, and balancing would shift every prediction toward 0.5."""
    if c is not None:
        return LogisticRegression(C=c, max_iter=2000).fit(x, y)
    folds = int(min(3, y.sum(), len(y) - y.sum()))
    if folds < 2:  # too few of one class to cross-validate: a middle strength
        return LogisticRegression(C=1.0, max_iter=2000).fit(x, y)
    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
    grid = GridSearchCV(
        LogisticRegression(max_iter=2000), {"C": list(CS)}, cv=cv, scoring="neg_log_loss"
    )
    return grid.fit(x, y).best_estimator_


def fit_length(
    x: np.ndarray, tokens: np.ndarray, alpha: float | None = None
) -> tuple[LengthModel, float]:
    """Ridge regression of log(1 + tokens) on the embedding, its strength chosen by
    leave-one-out CV unless `alpha` is given (log: lengths are skewed, and a relative error is
    what a cost share feels); with the strength."""
    y = np.log1p(tokens)
    model = RidgeCV(alphas=ALPHAS).fit(x, y) if alpha is None else Ridge(alpha=alpha).fit(x, y)
    return LengthModel(
        coef=[float(v) for v in model.coef_],
        intercept=float(model.intercept_),
        median_tokens=float(np.median(tokens)),
        examples=len(tokens),
    ), float(getattr(model, "alpha_", alpha))


def length_metrics(model: LengthModel, x: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
    """Median absolute error in tokens on held-out questions, the model's and the training
    median's (a length model is worth its place where it beats the median)."""
    predicted = np.array([model.predict(row) for row in x])
    return {
        "length_median_error_tokens": float(np.median(np.abs(predicted - tokens))),
        "length_median_error_of_median": float(np.median(np.abs(model.median_tokens - tokens))),
    }


def chosen_c(model: LogisticRegression) -> float:
    return float(model.C)


def bootstrap_auc(y: np.ndarray, p: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """AUC of each bootstrap resample (rows of `draws`, indices into y and p) by the rank-sum
    formula, all at once; resamples holding one class only are left out."""
    yy, ranks = y[draws], rankdata(p[draws], axis=1)
    pos = yy.sum(axis=1)
    neg = yy.shape[1] - pos
    ok = (pos > 0) & (neg > 0)
    rank_sum = (ranks * yy).sum(axis=1)
    return ((rank_sum - pos * (pos + 1) / 2) / np.maximum(pos * neg, 1))[ok]


def split_questions(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Question indices (train, held out): a seeded split of questions, so no question's rows
    are on both sides."""
    if not 0 < fraction < 1:
        raise ValueError(f"--heldout must be between 0 and 1, got {fraction}")
    idx = np.arange(n)
    train, held = train_test_split(idx, test_size=fraction, random_state=seed)
    if len(train) == 0 or len(held) == 0:
        raise OutcomesError(f"{n} questions cannot be split {1 - fraction:.0%}/{fraction:.0%}")
    return np.sort(train), np.sort(held)


def heldout_metrics(y: np.ndarray, p: np.ndarray, prior: float, seed: int) -> dict[str, float]:
    """AUC and Brier score of `p` on held-out labels `y`, and the Brier score of a constant
    `prior` (its AUC is 0.5 by definition, so not written), with 95% bootstrap intervals over the
    held-out questions (AUC; Brier's gain over the prior)."""
    out = {
        "n": float(len(y)),
        "positives": float(y.sum()),
        "prior": prior,
        "brier": float(brier_score_loss(y, p)),
        "brier_prior": float(brier_score_loss(y, np.full_like(p, prior))),
    }
    draws = np.random.default_rng(seed).integers(0, len(y), (BOOTSTRAP, len(y)))
    gains = np.mean((prior - y[draws]) ** 2, axis=1) - np.mean((p[draws] - y[draws]) ** 2, axis=1)
    out["brier_gain"] = out["brier_prior"] - out["brier"]
    out["brier_gain_lo"], out["brier_gain_hi"] = map(float, np.percentile(gains, [2.5, 97.5]))
    if 0 < y.sum() < len(y):  # AUC needs both classes
        out["auc"] = float(roc_auc_score(y, p))
        aucs = bootstrap_auc(y, p, draws)
        out["auc_lo"], out["auc_hi"] = map(float, np.percentile(aucs, [2.5, 97.5]))
    return out


def router_metrics(
    correct: np.ndarray, p: np.ndarray, prior: np.ndarray, candidates: list[str]
) -> dict[str, float | str]:
    """The scorer judged as a router is judged, on held-out questions every candidate answered
    (`correct[i, j]`, `p[i, j]`): its top-1 pick (the highest p; a tie to the earlier
    candidate) against the oracle (a candidate that was right, where one was) and against the
    prior's pick (always the candidate best on the training questions). Hit rate: the share of
    questions some candidate got right where the pick did; regret: the oracle's accuracy minus
    the pick's."""
    n = len(correct)
    out: dict[str, float | str] = {"questions": float(n)}
    if n == 0:
        return out
    oracle = correct.max(axis=1)
    pick = np.argmax(p, axis=1)
    best = int(np.argmax(prior))
    routed, constant = correct[np.arange(n), pick], correct[:, best]
    answerable = max(1.0, float(oracle.sum()))
    out |= {
        "oracle_accuracy": float(oracle.mean()),
        "top1_accuracy": float(routed.mean()),
        "top1_hit_rate": float(routed.sum() / answerable),
        "regret": float(oracle.mean() - routed.mean()),
        "prior_candidate": candidates[best],
        "prior_top1_accuracy": float(constant.mean()),
        "prior_hit_rate": float(constant.sum() / answerable),
        "prior_regret": float(oracle.mean() - constant.mean()),
        # How often the pick follows the question at all (1 candidate: a static router).
        "distinct_picks": float(len(set(pick.tolist()))),
    }
    return out


def _cannot_learn(cid: str, col: np.ndarray, tr: np.ndarray, ho: np.ndarray) -> str:
    """Why candidate `cid`'s labels `col` cannot train a fit on questions `tr` and judge it on
    `ho`: all its answers are of one class (no split helps), or its training questions are, or
    none is held out."""
    seen = col[~np.isnan(col)]
    if seen.sum() in (0, len(seen)):
        what = "no correct" if seen.sum() == 0 else "no wrong"
        return (
            f"candidate '{cid}' has {what} answers among its {len(seen)} graded questions: "
            "a scorer cannot learn from one class; add questions (another dataset, more "
            "samples) or leave it out with --skip-candidate"
        )
    return (
        f"candidate '{cid}': its {len(tr)} training questions hold "
        f"{int(col[tr].sum())} correct answers and {len(ho)} are held out; both classes "
        "must be in training and some questions held out: add questions, or change "
        "--seed / --heldout"
    )


def check_both_classes(outcomes: Outcomes) -> None:
    """Refuse a candidate whose graded answers are all right or all wrong before the questions
    are embedded (minutes with MiniLM on many questions): no split of them can help."""
    for j, cid in enumerate(outcomes.candidates):
        col = outcomes.correct[:, j]
        seen = col[~np.isnan(col)]
        if seen.sum() in (0, len(seen)):
            raise OutcomesError(_cannot_learn(cid, col, np.array([]), np.array([])))


def _length(
    outcomes: Outcomes,
    j: int,
    x: np.ndarray,
    train: np.ndarray,
    held: np.ndarray,
    metrics: dict[str, float],
) -> LengthModel | None:
    """Candidate j's length model, judged on its held-out questions (into `metrics`) and refit
    on all; None where fewer than MIN_LENGTH_EXAMPLES of its training questions have tokens."""
    if outcomes.tokens is None:
        return None
    col = outcomes.tokens[:, j]
    tr, ho = train[~np.isnan(col[train])], held[~np.isnan(col[held])]
    if len(tr) < MIN_LENGTH_EXAMPLES:
        return None
    model, alpha = fit_length(x[tr], col[tr])
    if len(ho):
        metrics |= length_metrics(model, x[ho], col[ho])
    seen = ~np.isnan(col)
    return fit_length(x[seen], col[seen], alpha)[0]


def train_scorer(outcomes: Outcomes, x: np.ndarray, opts: TrainOptions) -> Scorer:
    """`x[i]`: the embedding of question `outcomes.keys[i]`. Held-out metrics come from a fit
    on the training questions only; the file's models are refit on all questions with the
    strength CV chose there, so the router uses every label (the held-out numbers estimate
    that fit's quality, slightly pessimistically)."""
    if x.shape[0] != len(outcomes.keys):
        raise ValueError(f"{x.shape[0]} embeddings for {len(outcomes.keys)} questions")
    train, held = split_questions(len(outcomes.keys), opts.heldout_fraction, opts.seed)
    candidates: dict[str, CandidateModel] = {}
    heldout: dict[str, dict[str, float]] = {}
    held_p = np.full((len(held), len(outcomes.candidates)), np.nan)
    priors = np.zeros(len(outcomes.candidates))
    for j, cid in enumerate(outcomes.candidates):
        col = outcomes.correct[:, j]
        tr = train[~np.isnan(col[train])]
        ho = held[~np.isnan(col[held])]
        y_tr = col[tr]
        if y_tr.sum() in (0, len(y_tr)) or len(ho) == 0:
            raise OutcomesError(_cannot_learn(cid, col, tr, ho))
        model = fit_candidate(x[tr], y_tr, opts.seed)
        prior = float(y_tr.mean())
        p = model.predict_proba(x[ho])[:, 1]
        heldout[cid] = heldout_metrics(col[ho], p, prior, opts.seed)
        heldout[cid]["c"] = chosen_c(model)
        held_p[:, j], priors[j] = model.predict_proba(x[held])[:, 1], prior
        seen = ~np.isnan(col)
        final = fit_candidate(x[seen], col[seen], opts.seed, c=chosen_c(model))
        candidates[cid] = CandidateModel(
            coef=[float(v) for v in final.coef_[0]],
            intercept=float(final.intercept_[0]),
            prior=float(col[seen].mean()),
            positives=int(col[seen].sum()),
            examples=int(seen.sum()),
            length=_length(outcomes, j, x, train, held, heldout[cid]),
        )
    graded = ~np.isnan(outcomes.correct[held]).any(axis=1)
    router = router_metrics(
        outcomes.correct[held][graded], held_p[graded], priors, outcomes.candidates
    )
    return Scorer(
        embedder=opts.embedder,
        dim=int(x.shape[1]),
        candidates=candidates,
        trained_on={
            "runs": outcomes.runs,
            "datasets": sorted({d for d, _ in outcomes.keys}),
            "questions": len(outcomes.keys),
            "heldout_questions": [list(outcomes.keys[i]) for i in held],
            "heldout_fraction": opts.heldout_fraction,
            "seed": opts.seed,
            "ungraded_rows_skipped": outcomes.ungraded,
            "fit": "L2 logistic regression, strength by stratified CV (log loss) on the training "
            "questions; metrics from that fit on the held-out questions; the file's weights "
            "refit on all questions. Length: ridge regression of log(1 + output tokens), "
            "strength by leave-one-out CV, the same way",
        },
        heldout=heldout,
        heldout_router=router,
    )
