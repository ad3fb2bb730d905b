"""Per-question timeline (issue: "where the time goes"): one panel per setting for the same
question, one row per agent, showing when it waited for its precursors, its warm-ups, its exposed
prefill (request to first token) and its decoding, with the critical path marked. The prefill
bar is split into the PD parts the workers reported (experiments/pd_breakdown.py: bootstrap,
prefill queue and compute, KV transfer, first decode step, the way to the router); an unknown
part keeps the plain prefill colour. Written by `moa-pd plot` as `fig_timeline.png`;
`timeline_figure` for other callers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from experiments.critical_path import critical_path, final_agent
from experiments.pd_breakdown import COMPONENTS, boundaries
from experiments.results import ResultRow
from experiments.summary_table import setting_label

COLORS = {"wait": "#e8e8e8", "prefill": "#dd8452", "decode": "#4c72b0", "warmup": "#55a868"}
CRITICAL = "#c44e52"
PD_COLORS = dict(
    zip(COMPONENTS, ("#b07aa1", "#edc948", "#b85c00", "#9c755f", "#76b7b2", "#ff9da7"), strict=True)
)


def pick_question(rows: Sequence[ResultRow]) -> str | None:
    """The first question every MoA setting of the run answered without error and with times
    (the single-model baseline, #5, has no graph to draw)."""
    rows = [r for r in rows if r.single_model is None]
    settings = {r.setting for r in rows}
    ok: dict[str, set[int]] = {}
    for r in rows:
        if r.ok and r.agents and all(a.end_s is not None for a in r.agents.values()):
            ok.setdefault(r.sample_id, set()).add(r.setting)
    return next((sid for sid, s in ok.items() if s == settings), None)


def timeline_figure(rows: Sequence[ResultRow], sample_id: str) -> Figure:
    mine = sorted(
        (r for r in rows if r.sample_id == sample_id and r.ok and r.single_model is None),
        key=lambda r: r.setting,
    )
    # Each setting may run another topology (#1 is dense), so each panel lists its own agents.
    orders = [
        sorted(r.agents, key=lambda a, r=r: (r.agents[a].layer or 0, a), reverse=True) for r in mine
    ]
    span = max(r.e2e_s for r in mine)
    fig = Figure(figsize=(11, 0.9 + 0.28 * sum(len(o) + 2 for o in orders)))
    axes = fig.subplots(
        len(mine),
        1,
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [len(o) + 2 for o in orders]},
    )[:, 0]
    drawn: set[str] = set()
    for ax, row, order in zip(axes, mine, orders):
        drawn |= _draw(ax, row, order)
        ax.set_xlim(0, span * 1.02)
        ax.set_title(f"{setting_label(row.setting)}: {row.e2e_s:.1f} s", fontsize=9, loc="left")
    axes[-1].set_xlabel("seconds since the question started")
    legend = [Patch(color=c, label=k) for k, c in COLORS.items()]
    legend += [
        Patch(color=c, label=k.replace("_", " ")) for k, c in PD_COLORS.items() if k in drawn
    ]
    legend.append(Patch(facecolor="white", edgecolor=CRITICAL, label="critical path"))
    legend.append(Line2D([], [], color="black", marker="x", linestyle="none", label="killed"))
    fig.legend(handles=legend, loc="upper right", ncol=6, fontsize=8, frameon=False)
    fig.suptitle(f"{mine[0].dataset} {sample_id}", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def _draw(ax, row: ResultRow, order: list[str]) -> set[str]:
    """Draw one setting's panel; returns the PD parts it drew (for the legend)."""
    drawn: set[str] = set()
    final = final_agent(row)
    path = set(critical_path(row.agents, final)) if final else set()
    for y, agent_id in enumerate(order):
        a = row.agents[agent_id]
        if a.end_s is None:
            continue
        start = a.start_s or 0.0
        edge = CRITICAL if agent_id in path else "none"
        if a.final_request_s is None and a.killed:
            # A successor cut by early exit before it sent its final request only waited.
            bars = [((start, a.end_s - start), COLORS["wait"])]
        else:
            request = a.final_request_s if a.final_request_s is not None else start
            first = a.first_token_s if a.first_token_s is not None else a.end_s
            bars = [
                ((start, request - start), COLORS["wait"]),
                ((request, first - request), COLORS["prefill"]),
                ((first, a.end_s - first), COLORS["decode"]),
            ]
            b = boundaries(a, row.session_started_at) if a.first_token_s is not None else []
            for name, x0, x1 in zip(COMPONENTS, b, b[1:]):
                if x0 is not None and x1 is not None:
                    bars.append(((x0, x1 - x0), PD_COLORS[name]))
                    drawn.add(name)
        for (x, w), color in bars:
            if w > 0:
                ax.broken_barh(
                    [(x, w)], (y - 0.35, 0.7), facecolors=color, edgecolor=edge, linewidth=1.2
                )
        for sent, replied, *_ in a.warmup_spans:
            ax.broken_barh(
                [(sent, max(replied - sent, 0.02))], (y - 0.15, 0.3), facecolors=COLORS["warmup"]
            )
        if a.killed:
            ax.plot([a.end_s], [y], marker="x", color="black", markersize=5)
    ax.set_yticks(range(len(order)), order, fontsize=7)
    for label in ax.get_yticklabels():
        if label.get_text() in path:
            label.set_color(CRITICAL)
    ax.set_ylim(-0.6, len(order) - 0.4)
    return drawn


def plot_timeline(rows: Sequence[ResultRow], path: str | Path, dpi: int = 150) -> Path | None:
    """The timeline of one question every setting ran; None when there is none."""
    sample_id = pick_question(rows)
    if sample_id is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    timeline_figure(rows, sample_id).savefig(path, dpi=dpi, bbox_inches="tight")
    return path
