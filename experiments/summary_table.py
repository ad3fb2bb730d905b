"""The comparison table of a run's settings (rich), printed by the runner, `moa-pd plot` and
sweeps from `SettingSummary` rows."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from experiments.settings import SETTINGS
from experiments.summary import SettingSummary


def setting_label(number: int) -> str:
    s = SETTINGS.get(number)
    return s.label if s else f"#{number}"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _ratio_pair(median: float | None, mean: float | None) -> str:
    if median is None:
        return "-"
    return f"{median:.2f}/{mean:.2f}"


def _accuracy(s: SettingSummary) -> str:
    if s.accuracy is None:
        return "-"
    return f"{100 * s.accuracy:.1f}±{100 * s.accuracy_se:.1f}%"


def _activation(s: SettingSummary) -> str:
    return "\n".join(f"{m} {v:.0f}" for m, v in sorted(s.activation_pct.items())) or "-"


def build_table(summaries: Sequence[SettingSummary], title: str = "MoA settings") -> Table:
    settings = sorted({s.setting for s in summaries})
    table = Table(title=title, box=box.SIMPLE_HEAD, caption_justify="left", caption=(
        "; ".join(setting_label(n) for n in settings) + ".\n"
        "÷#R: E2E latency normalized to setting #R, as median of per-sample ratios / ratio of "
        "means (samples both ran without error).\nact: % of a model's agent runs that completed "
        "and were not killed. EE: early-exit decision time ÷ E2E. cached: cached ÷ prompt "
        "tokens of agents with precursors."))
    for name in ("dataset", "set", "n", "err", "acc ± SE", "mean s", "med s", "p90 s",
                 "÷#1 med/mean", "÷#2 med/mean", "act %", "EE", "warm-ups", "cached"):
        table.add_column(name, justify="left" if name in ("dataset", "set", "act %")
                         else "right", no_wrap=True)
    previous = None
    for s in summaries:
        if previous is not None and s.dataset != previous:
            table.add_section()
        previous = s.dataset
        table.add_row(
            s.dataset, f"#{s.setting}", str(s.n), f"[red]{s.errors}[/red]" if s.errors else "0",
            _accuracy(s), _num(s.latency_mean_s), _num(s.latency_median_s),
            _num(s.latency_p90_s),
            _ratio_pair(s.latency_vs_1_median, s.latency_vs_1_mean),
            _ratio_pair(s.latency_vs_2_median, s.latency_vs_2_mean),
            _activation(s), _pct(s.ee_overhead_share), _num(s.warmups_per_sample, "{:.1f}"),
            _pct(s.cached_token_ratio),
        )
    return table


def print_table(summaries: Sequence[SettingSummary], console: Console | None = None,
                title: str = "MoA settings") -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log file or pipe: do not squeeze to 80 columns
            console = Console(width=150)
    console.print(build_table(summaries, title))
