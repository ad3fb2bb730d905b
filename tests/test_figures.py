"""Figures from synthetic results: every PNG is written and readable, the latency panel says
what it is normalized to, the microbench bars are normalized to plain PD, `moa-pd plot` works."""

import json

import matplotlib.image as mpimg
import numpy as np
import pytest
from synthetic_results import make_microbench_rows, make_rows

from experiments import figures
from experiments.results import ResultsWriter, validate_row
from launch.cli import main as cli_main
from tests.text_checks import said


def _rows(**kw):
    return [validate_row(r) for r in make_rows(**kw)]


def _titles(fig):
    return " ".join(ax.get_title() + " " + ax.get_ylabel() for ax in fig.axes)


def test_write_figures_writes_four_readable_pngs(tmp_path):
    paths = figures.write_figures(_rows(n=6, errors=1), tmp_path, dpi=40)
    assert sorted(p.name for p in paths) == [
        "fig_activation_ee.png",
        "fig_latency_accuracy.png",
        "fig_latency_cdf.png",
        "fig_timeline.png",
    ]
    for p in paths:
        img = mpimg.imread(p)
        assert img.shape[0] > 50 and img.shape[1] > 50
        assert img[..., :3].std() > 0.01  # not a blank canvas


def test_latency_is_normalized_to_1_or_else_to_2():
    fig = figures.latency_accuracy_figure(_rows(n=5))
    assert "normalized to setting #1" in _titles(fig)
    top = fig.axes[0]
    heights = [b.get_height() for b in top.patches]
    assert heights[:2] == pytest.approx([1.0, 1.0])  # setting #1 bars, one per dataset
    fig = figures.latency_accuracy_figure(_rows(n=5, settings=(2, 3, 4)))
    assert "normalized to setting #2" in _titles(fig)
    fig = figures.latency_accuracy_figure(_rows(n=5, settings=(3, 4)))
    assert "(s)" in fig.axes[0].get_ylabel()


def test_activation_figure_needs_the_early_exit_setting(tmp_path):
    assert figures.plot_activation(_rows(n=3, settings=(1, 2)), tmp_path / "a.png", 40) is None
    assert not (tmp_path / "a.png").exists()


def test_microbench_bars_are_normalized_to_plain_pd():
    fig = figures.microbench_figure(make_microbench_rows(n=120))
    ax = fig.axes[0]
    by_label = {}
    for container, label in zip(ax.containers, [t.get_text() for t in ax.get_legend().texts]):
        by_label[label] = np.array([b.get_height() for b in container])
    pd = by_label[figures.MICROBENCH_VARIANTS["pd"]]
    assert np.allclose(pd[~np.isnan(pd)], 1.0)
    inc = by_label[figures.MICROBENCH_VARIANTS["incremental"]]
    assert 0.6 < inc[-1] < 0.9  # the "all" group; synthetic incremental is 0.75x PD
    assert ax.get_xticklabels()[-1].get_text() == "all"


def test_microbench_rejects_rows_it_cannot_normalize():
    with pytest.raises(ValueError, match="no 'pd' variant"):
        figures.microbench_figure([{"variant": "dp2", "prompt_tokens": 5, "latency_s": 1.0}])
    with pytest.raises(ValueError, match="unknown variant"):
        figures.microbench_figure([{"variant": "x", "prompt_tokens": 5, "latency_s": 1.0}])


def test_moa_pd_plot_rebuilds_everything_from_results_jsonl(tmp_path, capsys):
    writer = ResultsWriter(tmp_path / "results.jsonl")
    for row in make_rows(datasets=("gsm8k",), n=5):
        writer.append(row)
    with open(tmp_path / "microbench.jsonl", "w") as f:
        for row in make_microbench_rows(n=40):
            f.write(json.dumps(row) + "\n")
    assert cli_main(["plot", str(tmp_path), "--dpi", "40"]) == 0
    for name in (
        "summary.json",
        "fig_latency_accuracy.png",
        "fig_activation_ee.png",
        "fig_latency_cdf.png",
        "fig_microbench.png",
    ):
        assert (tmp_path / name).stat().st_size > 0
    assert cli_main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "no such results file" in said(capsys.readouterr().err)


def test_single_model_rows_get_their_own_bars_and_summary_lines(tmp_path):
    from experiments.summary import summarize
    from experiments.summary_table import build_table

    rows = make_rows(datasets=("gsm8k",), settings=(2, 3), n=4)
    for r in [r for r in rows if r["setting"] == 3]:
        for m, scale in (("qwen-4b", 0.2), ("qwen-32b", 0.5)):
            rows.append(
                {
                    **r,
                    "setting": 5,
                    "single_model": m,
                    "e2e_s": r["e2e_s"] * scale,
                    "agents": {"single": {"model": m}},
                    "early_exit": [],
                }
            )
    rows = [validate_row(r) for r in rows]
    summaries = summarize(rows)
    five = {s.single_model: s for s in summaries if s.setting == 5}
    assert set(five) == {"qwen-4b", "qwen-32b"} and all(s.n == 4 for s in five.values())
    assert five["qwen-4b"].paired["vs_3"]["latency_ratio_median"] == pytest.approx(0.2)
    fig = figures.latency_accuracy_figure(rows)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[-2:] == ["#5 single model qwen-32b", "#5 single model qwen-4b"]
    assert len(fig.axes[0].patches) == 4  # one bar per series, one dataset
    console = __import__("rich.console").console.Console(width=250, record=True)
    console.print(build_table(summaries))
    assert "#5 qwen-4b" in console.export_text()
    paths = figures.write_figures(rows, tmp_path, dpi=40)
    # No #4 rows: no activation figure; the timeline draws the MoA settings only.
    assert sorted(p.name for p in paths) == [
        "fig_latency_accuracy.png",
        "fig_latency_cdf.png",
        "fig_timeline.png",
    ]
