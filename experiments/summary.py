"""Per-(dataset, setting) statistics from results rows, and `summary.json`.

Called by `moa-pd plot` and the runner at the end of a run (`plot_cmd.rebuild`, which also
prints the table of `summary_table`), and by sweeps.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from experiments.critical_path import median_breakdown, overlap_gain
from experiments.paired_stats import bootstrap_ci, mcnemar
from experiments.pd_breakdown import median_path_breakdown
from experiments.results import ResultRow
from experiments.router_load import setting_load
from router.early_exit import activation_percentage

log = logging.getLogger(__name__)

REFERENCE_SETTINGS = (1, 2)
BLOCKING_REFERENCE = 2
# Settings every other setting is compared with, paired per question (3: what early exit and
# the single-model baseline are measured against, besides #1 and #2; 4: what routing (#6) is
# measured against, all proposers running; 7: the paper's own baseline, blocking by layer).
PAIRED_REFERENCES = (1, 2, 3, 4, 7)


@dataclass(slots=True)
class SettingSummary:
    """The numbers of one setting on one dataset. Latency fields cover rows without an error;
    `latency_vs_R_median` is the median of per-sample ratios e2e(s)/e2e(#R) over samples both
    settings ran without error, `latency_vs_R_mean` the ratio of the two means over those same
    samples. None where a number cannot be computed (no reference rows, nothing graded)."""

    dataset: str
    setting: int
    n: int  # rows, failed ones included
    errors: int
    graded: int  # rows with correct true/false
    accuracy: float | None
    accuracy_se: float | None  # binomial standard error sqrt(p(1-p)/graded)
    latency_mean_s: float | None
    latency_median_s: float | None
    latency_p90_s: float | None
    latency_vs_1_median: float | None
    latency_vs_1_mean: float | None
    latency_vs_2_median: float | None
    latency_vs_2_mean: float | None
    activation_pct: dict[str, float] = field(default_factory=dict)
    # Setting #5: the model that answered alone (one summary per model).
    single_model: str | None = None
    # 95% bootstrap CIs of latency_vs_R_median over the paired per-sample ratios.
    latency_vs_1_ci: list[float] | None = None
    latency_vs_2_ci: list[float] | None = None
    # Per reference setting R ("vs_1", "vs_2", "vs_3", "vs_7"; R != this setting) over the
    # samples both ran: latency ratio median and CI, accuracy difference (this - R) with its CI,
    # McNemar's exact test on the paired correct/incorrect outcomes.
    paired: dict[str, dict] = field(default_factory=dict)
    ee_overhead_share: float | None = None  # Σ decision seconds / Σ e2e_s
    ee_seconds_mean: float | None = None
    # Exits ÷ decisions that computed an exit probability (moot ones, whose draw said exit with
    # nothing left to cut, are counted apart and are in neither).
    ee_exit_rate: float | None = None
    ee_moot: int | None = None
    # Σ wall time of exiting decisions ÷ Σ e2e_s: the delay early exit put on the critical path
    # (a decision that does not exit delays nothing; its compute overlaps decoding).
    ee_critical_share: float | None = None
    warmups_per_sample: float | None = None
    cached_token_ratio: float | None = None  # Σ cached / Σ prompt over agents with a precursor
    config: str | None = None
    chunk_policy: str | None = None
    # Median seconds per part of the critical path (experiments/critical_path.py).
    critical_path_s: dict[str, float] | None = None
    # The critical path's PD requests, their TTFT split from the workers' timings
    # (experiments/pd_breakdown.py): per kind (leaf_prefill, exposed_prefill), median seconds
    # per component, "unknown" where the workers did not report it.
    pd_breakdown_s: dict[str, dict] | None = None
    # Pipelined settings: what overlap could save against blocking (#2) and what it saved.
    overlap_gain: dict | None = None
    # Each distinct error of the failed rows (first 300 characters) and how many rows had it, so
    # a run where everything failed still says why.
    error_messages: dict[str, int] = field(default_factory=dict)
    # Per question (rows without an error): agents that ran a model (not a candidate routing left
    # out, not a bypassed successor), output tokens of all agents and of the first layer (the
    # proposers).
    models_run_mean: float | None = None
    tokens_mean: float | None = None
    proposer_tokens_mean: float | None = None
    # Routed settings: Σ routing decision wall time ÷ Σ e2e_s (issue 20 wants ≤ 1%), and the
    # share of posterior-corrected answers found low (dropped or ordered last).
    routing_share: float | None = None
    posterior_low_rate: float | None = None
    # The shell router's own load (experiments/router_load.py), over every row with router
    # stats, failed ones included: CPU seconds per question, and its event loop's lag quantiles
    # (bucket upper bounds) over the probe's wakes meanwhile.
    router_cpu_s_per_question: float | None = None
    event_loop_lag_p50_s: float | None = None
    event_loop_lag_p99_s: float | None = None
    event_loop_lag_samples: int | None = None


def per_sample_ratios(
    rows: Sequence[ResultRow], dataset: str, setting: int, ref: int, model: str | None = None
) -> list[tuple[float, float]]:
    """(e2e of `setting`, e2e of `ref`) for every sample of `dataset` both ran without error;
    `model` picks setting #5's rows of that model (the reference is a MoA setting)."""
    mine = {
        r.sample_id: r.e2e_s
        for r in rows
        if r.dataset == dataset and r.ok and r.setting == setting and r.single_model == model
    }
    theirs = {
        r.sample_id: r.e2e_s
        for r in rows
        if r.dataset == dataset and r.ok and r.setting == ref and r.single_model is None
    }
    return [(e2e, theirs[sid]) for sid, e2e in mine.items() if sid in theirs]


def activation(rows: Sequence[ResultRow]) -> dict[str, float]:
    """Per-model activation %, as router.early_exit.activation_percentage defines it: the share
    of that model's planned agent runs (samples × its agents) that ran to completion and were
    not killed by early exit; an agent with no trace entry (a bypassed successor) or marked
    `skipped` is not activated. Failed rows are left out."""
    traces = [{aid: a.model_dump() for aid, a in r.agents.items()} for r in rows if r.ok]
    return activation_percentage(traces) if traces else {}


def _latency_vs(
    rows: Sequence[ResultRow], dataset: str, setting: int, ref: int, model: str | None = None
) -> tuple[float | None, float | None]:
    pairs = [(a, b) for a, b in per_sample_ratios(rows, dataset, setting, ref, model) if b > 0]
    if not pairs:
        return None, None
    own, base = np.array(pairs).T
    return float(np.median(own / base)), float(own.mean() / base.mean())


def _ratios(
    rows: Sequence[ResultRow], dataset: str, setting: int, ref: int, model: str | None = None
) -> list[float]:
    return [a / b for a, b in per_sample_ratios(rows, dataset, setting, ref, model) if b > 0]


def _ci(values: Sequence[float]) -> list[float] | None:
    ci = bootstrap_ci(values)
    return list(ci) if ci else None


def paired_comparison(
    rows: Sequence[ResultRow], dataset: str, setting: int, ref: int, model: str | None = None
) -> dict | None:
    """`setting` against `ref` on the samples both ran: latency ratio (median of per-sample
    ratios, 95% bootstrap CI), accuracy difference with its CI and McNemar's exact p."""
    ratios = _ratios(rows, dataset, setting, ref, model)
    graded = {
        (r.sample_id, r.setting): bool(r.correct)
        for r in rows
        if r.dataset == dataset
        and r.ok
        and r.correct is not None
        and r.single_model == (model if r.setting == setting else None)
    }
    both = [sid for (sid, s) in graded if s == setting and (sid, ref) in graded]
    if not ratios and not both:
        return None
    mine, theirs = [graded[(sid, setting)] for sid in both], [graded[(sid, ref)] for sid in both]
    test = mcnemar(mine, theirs)
    diffs = [float(a) - float(b) for a, b in zip(mine, theirs)]
    return {
        "questions": len(ratios),
        "latency_ratio_median": float(np.median(ratios)) if ratios else None,
        "latency_ratio_ci": _ci(ratios),
        "graded": test.n,
        "accuracy_diff": float(np.mean(diffs)) if diffs else None,
        "accuracy_diff_ci": _ci_mean(diffs),
        "only_this_correct": test.only_a,
        "only_ref_correct": test.only_b,
        "mcnemar_p": test.p_value if diffs else None,
    }


def _ci_mean(values: Sequence[float]) -> list[float] | None:
    ci = bootstrap_ci(values, stat=np.mean)
    return list(ci) if ci else None


def _single(values: set[str | None], what: str, dataset: str, setting: int) -> str | None:
    if len(values) > 1:
        log.warning(
            "dataset %s setting %d mixes %s values %s; the summary pools them",
            dataset,
            setting,
            what,
            sorted(map(str, values)),
        )
    return next(iter(values)) if len(values) == 1 else None


def summarize_setting(
    rows: Sequence[ResultRow], dataset: str, setting: int, model: str | None = None
) -> SettingSummary:
    """`rows` are every row of the run: the normalizations need the reference settings' rows."""
    mine = [
        r for r in rows if r.dataset == dataset and r.setting == setting and r.single_model == model
    ]
    ok = [r for r in mine if r.ok]
    graded = [bool(r.correct) for r in mine if r.correct is not None]
    acc = sum(graded) / len(graded) if graded else None
    lat = np.array([r.e2e_s for r in ok], dtype=np.float64)
    vs = {ref: _latency_vs(rows, dataset, setting, ref, model) for ref in REFERENCE_SETTINGS}
    ee_seconds = [sum(d.seconds for d in r.early_exit) for r in ok]
    has_ee = any(r.early_exit for r in ok)  # settings without early exit show "-", not 0%
    total_e2e = float(lat.sum()) if lat.size else 0.0
    # Successors whose final request ran: their prefill worker reported prompt and cached tokens.
    with_precursor = [
        a for r in ok for a in r.agents.values() if a.slot_order and a.prompt_tokens is not None
    ]
    prompt = sum(a.prompt_tokens for a in with_precursor)
    decisions = [d for r in ok for d in r.early_exit]
    drawn = [d for d in decisions if d.q is not None and not d.moot]
    exit_wall = sum(d.wall_s or d.seconds for d in decisions if d.exited)
    return SettingSummary(
        dataset=dataset,
        setting=setting,
        single_model=model,
        n=len(mine),
        errors=len(mine) - len(ok),
        graded=len(graded),
        accuracy=acc,
        accuracy_se=math.sqrt(acc * (1 - acc) / len(graded)) if graded else None,
        latency_mean_s=float(lat.mean()) if lat.size else None,
        latency_median_s=float(np.median(lat)) if lat.size else None,
        latency_p90_s=float(np.percentile(lat, 90)) if lat.size else None,
        latency_vs_1_median=vs[1][0],
        latency_vs_1_mean=vs[1][1],
        latency_vs_2_median=vs[2][0],
        latency_vs_2_mean=vs[2][1],
        activation_pct=activation(mine),
        latency_vs_1_ci=_ci(_ratios(rows, dataset, setting, 1, model)),
        latency_vs_2_ci=_ci(_ratios(rows, dataset, setting, 2, model)),
        paired={
            f"vs_{ref}": c
            for ref in PAIRED_REFERENCES
            if ref != setting
            and (c := paired_comparison(rows, dataset, setting, ref, model)) is not None
        },
        ee_overhead_share=sum(ee_seconds) / total_e2e if has_ee and total_e2e > 0 else None,
        ee_seconds_mean=float(np.mean(ee_seconds)) if has_ee else None,
        ee_exit_rate=sum(d.exited for d in drawn) / len(drawn) if drawn else None,
        ee_moot=sum(d.moot for d in decisions) if has_ee else None,
        ee_critical_share=exit_wall / total_e2e if has_ee and total_e2e > 0 else None,
        warmups_per_sample=(
            float(np.mean([sum(a.warmups for a in r.agents.values()) for r in ok])) if ok else None
        ),
        cached_token_ratio=(
            sum(a.cached_tokens or 0 for a in with_precursor) / prompt if prompt else None
        ),
        config=_single({r.config for r in mine}, "config", dataset, setting),
        chunk_policy=_single({r.chunk_policy for r in mine}, "chunk_policy", dataset, setting),
        critical_path_s=median_breakdown(ok),
        pd_breakdown_s=median_path_breakdown(ok),
        overlap_gain=_overlap_gain(rows, mine, dataset, setting),
        error_messages=dict(Counter(r.error[:300] for r in mine if r.error).most_common()),
        **_per_question(ok),
        **setting_load([r.router for r in mine if r.router is not None]),
    )


def _ran(a) -> bool:
    return not a.skipped and a.start_s is not None


def _proposer(a) -> bool:
    """A first-layer agent (rows without layers: one that read no precursor)."""
    return (a.layer if a.layer is not None else 2 if a.slot_order else 1) == 1


def _per_question(ok: Sequence[ResultRow]) -> dict:
    """Models run and output tokens per question, the routing share, posterior low rate."""
    if not ok:
        return {}
    routed = [r for r in ok if r.routing]
    corrected = [s for r in ok for p in r.posterior for s in p.get("scores", {})]
    low = sum(len(p.get("low", [])) for r in ok for p in r.posterior)
    e2e = sum(r.e2e_s for r in routed)
    return {
        "models_run_mean": float(np.mean([sum(map(_ran, r.agents.values())) for r in ok])),
        "tokens_mean": float(
            np.mean([sum(len(a.output_ids) for a in r.agents.values()) for r in ok])
        ),
        "proposer_tokens_mean": float(
            np.mean([sum(len(a.output_ids) for a in r.agents.values() if _proposer(a)) for r in ok])
        ),
        "routing_share": (
            sum(r.routing.get("wall_s", 0.0) for r in routed) / e2e if routed and e2e > 0 else None
        ),
        "posterior_low_rate": low / len(corrected) if corrected else None,
    }


def _overlap_gain(
    rows: Sequence[ResultRow], mine: Sequence[ResultRow], dataset: str, setting: int
) -> dict | None:
    """Against setting #2 (tree, blocking), for a pipelined setting."""
    if setting == BLOCKING_REFERENCE or not any(r.mode == "pipelined" for r in mine):
        return None
    gain = overlap_gain(rows, dataset, setting, BLOCKING_REFERENCE)
    if gain is None:
        return None
    return {
        "vs_setting": BLOCKING_REFERENCE,
        "questions": gain.questions,
        "possible_s": gain.possible_s,
        "realized_s": gain.realized_s,
        "realized_over_possible": gain.realized_over_possible,
    }


def summarize(rows: Sequence[ResultRow]) -> list[SettingSummary]:
    """One SettingSummary per (dataset, setting) present, and per model for #5, sorted by
    dataset then setting."""
    groups = sorted({(r.dataset, r.setting, r.single_model or "") for r in rows})
    return [summarize_setting(rows, d, s, m or None) for d, s, m in groups]


def summary_document(summaries: Sequence[SettingSummary], source: str) -> dict:
    return {
        "results": source,
        "latency_normalization": (
            "latency_vs_R_median: median over samples of e2e(setting)/e2e(#R); "
            "latency_vs_R_mean: mean e2e(setting) / mean e2e(#R); both over the samples that "
            "both settings ran without error"
        ),
        "activation_pct": (
            "per model: % of its planned agent runs (samples x its agents) that completed and "
            "were not killed by early exit; failed rows left out"
        ),
        "latency_vs_R_ci": "95% percentile bootstrap CI (10000 resamples of the samples) of "
        "latency_vs_R_median",
        "paired": (
            "per reference setting R over samples both ran without error: latency ratio median "
            "and 95% bootstrap CI; accuracy_diff = accuracy(this) - accuracy(R) over samples "
            "both graded, its 95% bootstrap CI, and McNemar's exact two-sided p on the "
            "discordant pairs (only_this_correct, only_ref_correct)"
        ),
        "critical_path_s": (
            "median seconds per part of the critical path (final agent back through the "
            "precursor that ended last): leaf_prefill (leaf request to first token), "
            "exposed_prefill (successors' final request to first token), decode, other"
        ),
        "pd_breakdown_s": (
            "the TTFT of the critical path's requests (leaf_prefill: leaves'; exposed_prefill: "
            "successors' final requests), summed per question, "
            "split by the workers' meta_info timings: bootstrap (to prefill and its bootstrap "
            "queue), prefill_queue, prefill_compute, kv_transfer (prefill finished to KV at "
            "decode), first_decode_step (decode's queue and the step emitting the first token), "
            "to_router (from decode sending the token to the router receiving it); median over "
            "the questions that know each, 'unknown' where no worker reported it (without "
            "--enable-metrics; the prefill side of a request through a native router); unattributed = TTFT "
            "the unknown parts cover"
        ),
        "overlap_gain": (
            "pipelined settings vs #2 over paired questions: possible_s = sum of #2's exposed "
            "prefill on its critical path (what perfect overlap could save), realized_s = sum of "
            "e2e(#2) - e2e(this)"
        ),
        "per_question": (
            "models_run_mean: agents that ran a model per question (a candidate routing left "
            "out or a bypassed successor did not); tokens_mean / proposer_tokens_mean: output "
            "tokens of all agents / of the first layer; routing_share: Σ routing decision wall "
            "time ÷ Σ e2e; posterior_low_rate: answers posterior correction dropped or ordered "
            "last ÷ answers it scored"
        ),
        "router_load": (
            "the shell router's own load, from its GET /v1/moa/stats before and after each "
            "question (rows without them, of older runs, are left out): "
            "router_cpu_s_per_question = its process's CPU seconds (user + system, all threads) "
            "over the setting's questions ÷ their number; event_loop_lag_p50_s / _p99_s = "
            "quantiles of how late its 50 ms asyncio timer fired meanwhile, over "
            "event_loop_lag_samples wakes. At --concurrency 1 each question's window is its own "
            "(the row's router_cpu_s, router_lag_p99_s); at higher concurrency settings run in "
            "blocks, one at a time, and a setting's overlapping windows are merged into spans and the spans' "
            "totals are divided by the questions in them (an average: the router's work for "
            "concurrent questions cannot be told apart). Quantiles come from histogram buckets "
            "(0.1 ms to 5 s, about 2.5x apart) and are the upper bound of the bucket holding "
            "them: the true value lies between that bound and the one below; one past 5 s is "
            "reported as 5 s. The windows also hold the router's background work (its health "
            "probes of every process, twice a second) and the two stats requests"
        ),
        "settings": [asdict(s) for s in summaries],
    }


def write_summary(summaries: Sequence[SettingSummary], path: str | Path, source: str) -> None:
    Path(path).write_text(
        json.dumps(summary_document(summaries, source), indent=2) + "\n", encoding="utf-8"
    )
