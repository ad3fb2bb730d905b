"""Paper-style PNG figures from results rows: Fig. 4(ii) latency + accuracy, Fig. 4(i) activation
and early-exit overhead, a latency CDF, the work per question (models run, proposer tokens) when
a run has the routed setting #6, and Fig. 4(iii) from microbench rows. Called by
`moa-pd plot` and the runner. Uses matplotlib's object API (Agg canvas), never pyplot state.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from experiments.results import ResultRow
from experiments.summary import SettingSummary, per_sample_ratios, summarize
from experiments.summary_table import setting_label
from experiments.timeline import plot_timeline

log = logging.getLogger(__name__)

SETTING_COLORS = {
    1: "#9e9e9e",
    2: "#4c72b0",
    3: "#55a868",
    4: "#c44e52",
    6: "#dd8452",
    7: "#1f3a63",
}
# Setting #5 (single model): one shade per model, in the run's model order.
SINGLE_COLORS = ("#8172b2", "#937860", "#da8bc3", "#ccb974", "#64b5cd")

Series = tuple[int, str | None]  # (setting, single model): one bar or curve


def _series(rows: Sequence[ResultRow]) -> list[Series]:
    return sorted({(r.setting, r.single_model) for r in rows}, key=lambda k: (k[0], k[1] or ""))


def _color(key: Series, keys: Sequence[Series]) -> str | None:
    if key[1] is None:
        return SETTING_COLORS.get(key[0])
    singles = [k for k in keys if k[1] is not None]
    return SINGLE_COLORS[singles.index(key) % len(SINGLE_COLORS)]


def _of(rows: Sequence[ResultRow], d: str, key: Series) -> list[ResultRow]:
    return [r for r in rows if r.dataset == d and (r.setting, r.single_model) == key and r.ok]


def _grouped_x(n_groups: int, n_bars: int, width: float = 0.8) -> tuple[np.ndarray, float]:
    """Bar offsets within each group: returns (offsets per bar, single bar width)."""
    w = width / max(n_bars, 1)
    return (np.arange(n_bars) - (n_bars - 1) / 2) * w, w


def _label_above(ax, xs, heights, ups, fmt: str) -> None:
    """Value labels above each whisker, so they never sit under an error-bar cap."""
    top = ax.get_ylim()[1]
    for x, h, up in zip(xs, heights, ups):
        if not np.isnan(h):  # a missing bar has no label
            ax.text(
                x,
                h + (up or 0.0) + 0.015 * top,
                fmt.format(h),
                ha="center",
                va="bottom",
                fontsize=7,
            )


def _natural(name: str) -> list:
    """Sort key that puts qwen-4b before qwen-32b."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _save(fig: Figure, path: Path, dpi: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def _reference(rows: Sequence[ResultRow], datasets: list[str]) -> int | None:
    """Normalize to #1 when every dataset ran it, else to #2, else not at all."""
    for ref in (1, 2):
        if all(any(r.dataset == d and r.setting == ref and r.ok for r in rows) for d in datasets):
            return ref
    return None


def plot_latency_accuracy(rows: Sequence[ResultRow], path: str | Path, dpi: int = 150) -> Path:
    """Fig. 4(ii): per dataset, per-sample latency normalized to #1 (or #2) and accuracy."""
    return _save(latency_accuracy_figure(rows), Path(path), dpi)


def latency_accuracy_figure(rows: Sequence[ResultRow]) -> Figure:
    datasets = sorted({r.dataset for r in rows})
    settings = _series(rows)
    ref = _reference(rows, datasets)
    acc = {(s.dataset, (s.setting, s.single_model)): s for s in summarize(rows)}
    fig = Figure(figsize=(max(6.0, 1.6 * len(datasets) * len(settings) / 2 + 3), 6.5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    x = np.arange(len(datasets))
    offsets, w = _grouped_x(len(datasets), len(settings))
    labels = []
    for off, s in zip(offsets, settings):
        heights, lo, hi = [], [], []
        for d in datasets:
            if ref is None:
                vals = np.array([r.e2e_s for r in _of(rows, d, s)])
            else:
                vals = np.array(
                    [a / b for a, b in per_sample_ratios(rows, d, s[0], ref, s[1]) if b > 0]
                )
            med = float(np.median(vals)) if vals.size else np.nan
            heights.append(med)
            lo.append(med - np.percentile(vals, 25) if vals.size else 0.0)
            hi.append(np.percentile(vals, 75) - med if vals.size else 0.0)
        top.bar(
            x + off,
            heights,
            w,
            yerr=[lo, hi],
            capsize=3,
            label=setting_label(*s),
            color=_color(s, settings),
            error_kw={"elinewidth": 0.8},
        )
        labels.append((top, x + off, heights, hi, "{:.2f}"))
        a = [acc[(d, s)].accuracy if (d, s) in acc else None for d in datasets]
        se = [
            100 * acc[(d, s)].accuracy_se if (d, s) in acc and a[i] is not None else 0.0
            for i, d in enumerate(datasets)
        ]
        a = [100 * v if v is not None else np.nan for v in a]
        bottom.bar(
            x + off,
            a,
            w,
            yerr=se,
            capsize=3,
            color=_color(s, settings),
            error_kw={"elinewidth": 0.8},
        )
        labels.append((bottom, x + off, a, se, "{:.0f}"))
    if ref is None:
        top.set_ylabel("median per-sample E2E latency (s)")
        top.set_title(
            "Per-sample E2E latency\n(median; whiskers: 25th-75th percentile)", fontsize=10
        )
    else:
        top.axhline(1.0, color="black", lw=0.8, ls="--")
        top.set_ylabel(f"E2E latency ÷ setting #{ref}")
        top.set_title(
            f"Per-sample E2E latency normalized to setting #{ref}\n"
            "(median of per-sample ratios; whiskers: 25th-75th percentile)",
            fontsize=10,
        )
    top.set_ylim(0, top.get_ylim()[1] * 1.12)
    for args in labels:
        _label_above(*args)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="setting")
    bottom.set_ylabel("accuracy (%)")
    bottom.set_ylim(0, 112)
    bottom.set_title("Accuracy (whiskers: ± 1 standard error)", fontsize=10)
    n = {d: len({r.sample_id for r in rows if r.dataset == d}) for d in datasets}
    bottom.set_xticks(x, [f"{d} (n={n[d]})" for d in datasets])
    bottom.set_xlabel("dataset")
    fig.tight_layout()
    return fig


def plot_activation(
    rows: Sequence[ResultRow], path: str | Path, dpi: int = 150, setting: int = 4
) -> Path | None:
    """Fig. 4(i): per-model activation % per dataset and the early-exit overhead share, for the
    early-exit setting. None (nothing written) when no row of that setting exists."""
    summaries: list[SettingSummary] = [
        s for s in summarize(rows) if s.setting == setting and s.activation_pct
    ]
    if not summaries:
        log.info("no setting #%d row without an error: skipping the activation figure", setting)
        return None
    datasets = [s.dataset for s in summaries]
    models = sorted({m for s in summaries for m in s.activation_pct}, key=_natural)
    fig = Figure(figsize=(max(8.0, 2.2 * len(datasets) + 5), 3.8))
    left, right = fig.subplots(1, 2, width_ratios=[2.2, 1])
    x = np.arange(len(datasets))
    offsets, w = _grouped_x(len(datasets), len(models))
    for off, m in zip(offsets, models):
        bars = left.bar(x + off, [s.activation_pct.get(m, np.nan) for s in summaries], w, label=m)
        left.bar_label(bars, fmt="%.0f", padding=2, fontsize=7)
    left.set_xticks(x, datasets)
    left.set_ylim(0, 128)
    left.set_ylabel("activation (%)")
    left.set_xlabel("dataset")
    left.set_title(
        f"Agent runs completed and not killed, per model ({setting_label(setting)})", fontsize=10
    )
    left.legend(fontsize=8, loc="upper center", ncol=len(models), frameon=False)
    share = [
        100 * s.ee_overhead_share if s.ee_overhead_share is not None else np.nan for s in summaries
    ]
    bars = right.bar(x, share, 0.6, color=SETTING_COLORS[4])
    right.bar_label(bars, fmt="%.1f%%", padding=2, fontsize=7)
    right.set_xticks(x, datasets)
    right.set_ylim(0, max([v for v in share if not np.isnan(v)] + [1.0]) * 1.25)
    right.set_ylabel("share of E2E latency (%)")
    right.set_xlabel("dataset")
    right.set_title("Early-exit decision time ÷ E2E", fontsize=10)
    fig.tight_layout()
    return _save(fig, Path(path), dpi)


ROUTED = 6


def plot_work(rows: Sequence[ResultRow], path: str | Path, dpi: int = 150) -> Path | None:
    """Per dataset and setting: models run per question and proposer output tokens per question
    (mean), what routing (#6) saves against running every proposer. None (nothing written)
    without a #6 row."""
    if not any(r.setting == ROUTED and r.ok for r in rows):
        return None
    summaries = [s for s in summarize(rows) if s.models_run_mean is not None]
    datasets = sorted({s.dataset for s in summaries})
    keys = sorted(
        {(s.setting, s.single_model) for s in summaries}, key=lambda k: (k[0], k[1] or "")
    )
    by = {(s.dataset, (s.setting, s.single_model)): s for s in summaries}
    fig = Figure(figsize=(max(8.0, 1.2 * len(datasets) * len(keys) / 2 + 5), 3.8))
    axes = fig.subplots(1, 2)
    x = np.arange(len(datasets))
    offsets, w = _grouped_x(len(datasets), len(keys))
    for ax, attr, fmt in (
        (axes[0], "models_run_mean", "%.1f"),
        (axes[1], "proposer_tokens_mean", "%.0f"),
    ):
        for off, k in zip(offsets, keys):
            values = [getattr(by[(d, k)], attr) if (d, k) in by else np.nan for d in datasets]
            bars = ax.bar(x + off, values, w, label=setting_label(*k), color=_color(k, keys))
            ax.bar_label(bars, fmt=fmt, padding=2, fontsize=7)
        ax.set_xticks(x, datasets)
        ax.set_xlabel("dataset")
    axes[0].set_ylabel("agents run per question (mean)")
    axes[0].set_title("Models run per question", fontsize=10)
    axes[1].set_ylabel("proposer output tokens per question (mean)")
    axes[1].set_title("Proposer tokens per question", fontsize=10)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="setting")
    fig.tight_layout()
    return _save(fig, Path(path), dpi)


def plot_latency_cdf(rows: Sequence[ResultRow], path: str | Path, dpi: int = 150) -> Path:
    """Empirical CDF of per-sample E2E latency, one line per setting, one panel per dataset."""
    datasets = sorted({r.dataset for r in rows})
    cols = min(3, len(datasets))
    n_rows = -(-len(datasets) // cols)
    fig = Figure(figsize=(4.6 * cols + 2.4, 3.4 * n_rows))
    axes = np.atleast_1d(fig.subplots(n_rows, cols, squeeze=False)).ravel()
    handles: dict[Series, object] = {}
    keys = _series(rows)
    for ax, d in zip(axes, datasets):
        counts = []
        for s in keys:
            lat = np.sort([r.e2e_s for r in _of(rows, d, s)])
            if lat.size:
                # Start each curve at (first latency, 0) so it rises from the axis.
                (handles[s],) = ax.step(
                    np.r_[lat[0], lat],
                    np.arange(lat.size + 1) / lat.size,
                    where="post",
                    color=_color(s, keys),
                )
                counts.append(lat.size)
        n = (
            f"{min(counts)}"
            if min(counts, default=0) == max(counts, default=0)
            else f"{min(counts)}-{max(counts)}"
        )
        ax.set_title(f"{d}: E2E latency CDF ({n} samples per setting)", fontsize=10)
        ax.set_xlabel("E2E latency per sample (s)")
        ax.set_ylabel("fraction of samples")
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    # One legend for all panels, outside the plots so it never hides a curve.
    axes[min(cols, len(datasets)) - 1].legend(
        [handles[s] for s in keys if s in handles],
        [setting_label(*s) for s in keys if s in handles],
        fontsize=8,
        title="setting",
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
    )
    for ax in axes[len(datasets) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return _save(fig, Path(path), dpi)


def write_figures(rows: Sequence[ResultRow], run_dir: str | Path, dpi: int = 150) -> list[Path]:
    """Every run figure into RUN_DIR; returns the paths written."""
    run_dir = Path(run_dir)
    if not rows:
        log.warning("no results rows: no figures written")
        return []
    if not any(r.ok for r in rows):
        log.warning(
            "every results row failed (their errors are in summary.json): no figures written"
        )
        return []
    written = [
        plot_latency_accuracy(rows, run_dir / "fig_latency_accuracy.png", dpi),
        plot_activation(rows, run_dir / "fig_activation_ee.png", dpi),
        plot_latency_cdf(rows, run_dir / "fig_latency_cdf.png", dpi),
        plot_timeline(rows, run_dir / "fig_timeline.png", dpi),
        plot_work(rows, run_dir / "fig_work_routing.png", dpi),
    ]
    return [p for p in written if p is not None]


MICROBENCH_VARIANTS = {
    "incremental": "incremental prefill (PD)",
    "pd": "plain PD",
    "dp2": "2 data-parallel replicas",
    "dp2_chunked": "2 DP replicas + chunked prefill",
}


def plot_microbench(
    rows: Sequence[dict],
    path: str | Path,
    dpi: int = 150,
    bin_tokens: int = 256,
    max_tokens: int = 2048,
) -> Path:
    """Fig. 4(iii) (see microbench_figure) as a PNG."""
    return _save(microbench_figure(rows, bin_tokens, max_tokens), Path(path), dpi)


def microbench_figure(
    rows: Sequence[dict], bin_tokens: int = 256, max_tokens: int = 2048
) -> Figure:
    """Fig. 4(iii): mean second-layer aggregator latency per prompt-length bin, ÷ plain PD's mean
    in the same bin. Each row: `variant` (a MICROBENCH_VARIANTS key), `prompt_tokens` (int),
    `latency_s` (float). The last group, "all", uses every row."""
    for i, r in enumerate(rows):
        missing = [k for k in ("variant", "prompt_tokens", "latency_s") if k not in r]
        if missing:
            raise ValueError(
                f"microbench row {i} lacks {missing}; each row needs variant, "
                "prompt_tokens and latency_s"
            )
        if r["variant"] not in MICROBENCH_VARIANTS:
            raise ValueError(
                f"microbench row {i}: unknown variant {r['variant']!r}; "
                f"use one of {list(MICROBENCH_VARIANTS)}"
            )
    if not any(r["variant"] == "pd" for r in rows):
        raise ValueError("microbench rows have no 'pd' variant: it is the normalization base")
    edges = list(range(0, max_tokens, bin_tokens)) + [10**9]
    groups: list[tuple[str, list[dict]]] = []
    for lo, hi in itertools.pairwise(edges):
        label = f"{lo + 1}-{hi}" if hi < 10**9 else f">{lo}"
        members = [r for r in rows if lo < r["prompt_tokens"] <= hi]
        if any(r["variant"] == "pd" for r in members):
            groups.append((label, members))
    groups.append(("all", list(rows)))
    variants = [v for v in MICROBENCH_VARIANTS if any(r["variant"] == v for r in rows)]
    fig = Figure(figsize=(min(14.0, max(7.0, 0.25 * len(groups) * len(variants) + 3)), 4.0))
    ax = fig.subplots()
    x = np.arange(len(groups))
    offsets, w = _grouped_x(len(groups), len(variants))
    for off, v in zip(offsets, variants):
        heights = []
        for _, members in groups:
            base = np.mean([r["latency_s"] for r in members if r["variant"] == "pd"])
            mine = [r["latency_s"] for r in members if r["variant"] == v]
            heights.append(np.mean(mine) / base if mine and base > 0 else np.nan)
        ax.bar(x + off, heights, w, label=MICROBENCH_VARIANTS[v])
        # Numbers only on the "all" group, inside the bar foot: above the bars they would
        # cross the 1.0 line.
        ax.text(
            x[-1] + off,
            0.03,
            f"{heights[-1]:.2f}",
            ha="center",
            va="bottom",
            fontsize=7,
            rotation=90,
            color="white",
            fontweight="bold",
        )
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(x, [g for g, _ in groups], rotation=30, ha="right")
    ax.set_xlabel("prompt length bin (tokens)")
    ax.set_ylabel("mean latency ÷ plain PD (same bin)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_title("Second-layer aggregator E2E latency, normalized to plain PD", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
