"""The comparison table of a run's settings (rich), printed by the runner, `moa-pd plot` and
sweeps from `SettingSummary` rows."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from experiments.settings import SETTINGS
from experiments.summary import SettingSummary


def setting_label(number: int, model: str | None = None) -> str:
    """ "#3 tree, pipelined", and for #5 the model: "#5 single model qwen3-8b"."""
    s = SETTINGS.get(number)
    label = s.label if s else f"#{number}"
    return f"{label} {model}" if model else label


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _ratio_pair(median: float | None, mean: float | None, ci: list[float] | None) -> str:
    if median is None:
        return "-"
    band = f"\n[{ci[0]:.2f},{ci[1]:.2f}]" if ci else ""
    return f"{median:.2f}/{mean:.2f}{band}"


# The setting each one's accuracy is compared with in the table: the one it changes one thing
# of (#4 adds early exit to #3, ...); summary.json holds every pair.
ACCURACY_REFERENCE = {2: 1, 3: 2, 4: 3, 6: 4}


def _accuracy_diff(s: SettingSummary) -> str:
    ref = ACCURACY_REFERENCE.get(s.setting, 3)
    c = s.paired.get(f"vs_{ref}")
    if not c or c["accuracy_diff"] is None:
        return "-"
    return f"{100 * c['accuracy_diff']:+.1f}pp vs #{ref}\np={c['mcnemar_p']:.2f}"


def _accuracy(s: SettingSummary) -> str:
    if s.accuracy is None:
        return "-"
    return f"{100 * s.accuracy:.1f}±{100 * s.accuracy_se:.1f}%"


def _exits(s: SettingSummary) -> str:
    if s.ee_exit_rate is None:
        return "-"
    return f"{100 * s.ee_exit_rate:.0f}%" + (f"\n+{s.ee_moot} moot" if s.ee_moot else "")


def _ee(s: SettingSummary) -> str:
    if s.ee_overhead_share is None:
        return "-"
    return f"{_pct(s.ee_overhead_share)}/{_pct(s.ee_critical_share)}"


def _tokens(s: SettingSummary) -> str:
    if s.tokens_mean is None:
        return "-"
    return f"{s.tokens_mean:.0f}/{s.proposer_tokens_mean:.0f}"


def _router(s: SettingSummary) -> str:
    if s.router_cpu_s_per_question is None:
        return "-"
    p99 = s.event_loop_lag_p99_s
    return f"{s.router_cpu_s_per_question:.2f}s/" + ("-" if p99 is None else f"{p99 * 1e3:g}ms")


def _activation(s: SettingSummary) -> str:
    return "\n".join(f"{m} {v:.0f}" for m, v in sorted(s.activation_pct.items())) or "-"


def build_table(summaries: Sequence[SettingSummary], title: str = "MoA settings") -> Table:
    settings = sorted({s.setting for s in summaries})
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        caption_justify="left",
        caption=(
            "; ".join(setting_label(n) for n in settings) + ".\n"
            "÷#R: E2E latency normalized to setting #R, as median of per-sample ratios / ratio of "
            "means (samples both ran without error), the median's 95% bootstrap CI below. Δacc: "
            "accuracy difference with the setting it extends, paired, McNemar's exact p.\n"
            "act: % of a model's agent runs that completed "
            "and were not killed. exits: exits ÷ decisions that drew (moot: the draw said exit "
            "with nothing left to cut). EE: early-exit decision compute ÷ E2E / exiting decisions' "
            "wall time (their delay on the critical path) ÷ E2E. cached: cached ÷ prompt "
            "tokens of agents with precursors. models/q: agents that ran a model per question; "
            "tokens/q: output tokens per question, all agents / proposers; route: routing "
            "decision wall time ÷ E2E. router: the shell router's CPU seconds per question / its "
            "event-loop lag p99 (a histogram bucket's upper bound)."
        ),
    )
    for name in (
        "dataset",
        "set",
        "n",
        "err",
        "acc ± SE",
        "mean s",
        "med s",
        "p90 s",
        "÷#1 med/mean",
        "÷#2 med/mean",
        "Δacc",
        "act %",
        "exits",
        "EE",
        "warm-ups",
        "cached",
        "models/q",
        "tokens/q",
        "route",
        "router",
    ):
        table.add_column(
            name, justify="left" if name in ("dataset", "set", "act %") else "right", no_wrap=True
        )
    previous = None
    for s in summaries:
        if previous is not None and s.dataset != previous:
            table.add_section()
        previous = s.dataset
        table.add_row(
            s.dataset,
            f"#{s.setting}" + (f" {s.single_model}" if s.single_model else ""),
            str(s.n),
            f"[red]{s.errors}[/red]" if s.errors else "0",
            _accuracy(s),
            _num(s.latency_mean_s),
            _num(s.latency_median_s),
            _num(s.latency_p90_s),
            _ratio_pair(s.latency_vs_1_median, s.latency_vs_1_mean, s.latency_vs_1_ci),
            _ratio_pair(s.latency_vs_2_median, s.latency_vs_2_mean, s.latency_vs_2_ci),
            _accuracy_diff(s),
            _activation(s),
            _exits(s),
            _ee(s),
            _num(s.warmups_per_sample, "{:.1f}"),
            _pct(s.cached_token_ratio),
            _num(s.models_run_mean, "{:.1f}"),
            _tokens(s),
            _pct(s.routing_share),
            _router(s),
        )
    return table


def print_table(
    summaries: Sequence[SettingSummary], console: Console | None = None, title: str = "MoA settings"
) -> None:
    if console is None:
        console = Console(soft_wrap=True)
        if not console.is_terminal:  # a log file or pipe: do not squeeze to 80 columns
            console = Console(width=200, soft_wrap=True)
    console.print(build_table(summaries, title))
