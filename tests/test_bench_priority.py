"""bench_priority's arrivals (closed loop, or an open loop at a Poisson rate) and its report."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_priority import arrival_times, report


def test_a_closed_loop_block_arrives_at_once():
    assert arrival_times(5, None, seed=0) == [0.0] * 5


def test_an_open_loop_arrives_at_a_seeded_poisson_rate():
    times = arrival_times(4000, 0.5, seed=3)
    assert times[0] == 0.0 and times == sorted(times)
    assert np.mean(np.diff(times)) == pytest.approx(2.0, rel=0.05)  # 1 / rate
    assert times[:8] == arrival_times(8, 0.5, seed=3)  # both variants see the same times
    assert arrival_times(8, 0.5, seed=4) != arrival_times(8, 0.5, seed=3)


def test_report_pairs_each_question_across_the_variants():
    rows = [
        {
            "id": q,
            "variant": v,
            "block": 0,
            "concurrency": 8,
            "block_wall_s": 100.0,
            "in_flight_s": t,
            "from_arrival_s": t,
        }
        for q, fcfs, workflow in (("a", 100.0, 50.0), ("b", 100.0, 100.0))
        for v, t in (("fcfs", fcfs), ("workflow", workflow))
    ]
    text = report(rows, {"command": "x", "load_before": "0", "load_after": "0"})
    # Per question workflow ÷ FCFS: 0.5 and 1.0; ratio of means 75 / 100.
    assert "| 8 | in flight | 0.750 [" in text and "| 0.750 | 1.000 |" in text
    assert "| 8 | fcfs | 2 | 0.0200 | 100.0 / 100.0 / 100.0 |" in text


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("argv", "deployed_for"),
    [(["--concurrency", "4,8"], 8), (["--concurrency", "8", "--deploy-concurrency", "1"], 1)],
)
def test_the_deployment_is_started_for_the_runs_concurrency(
    monkeypatch, tmp_path, argv, deployed_for
):
    """As `moa-pd run` starts its own: the decode workers' running requests sized for the
    largest concurrency, unless --deploy-concurrency says otherwise."""
    from benchmarks import bench_priority, shell_routers

    seen = {}

    def make_stack(configs, backend, run_dir, host, placement=None, **_):
        seen["concurrency"] = placement.concurrency
        raise _Stop

    monkeypatch.setattr(shell_routers, "make_stack", make_stack)
    monkeypatch.setattr(
        "sys.argv", ["bench_priority", "--num-samples", "1", "--out", str(tmp_path), *argv]
    )
    with pytest.raises(_Stop):
        bench_priority.main()
    assert seen == {"concurrency": deployed_for}


def test_a_deployment_for_no_questions_is_refused(monkeypatch, capsys):
    from benchmarks import bench_priority

    monkeypatch.setattr("sys.argv", ["bench_priority", "--deploy-concurrency", "0"])
    with pytest.raises(SystemExit) as e:
        bench_priority.main()
    assert e.value.code == 2
    assert "--deploy-concurrency must be at least 1, got 0" in capsys.readouterr().err
