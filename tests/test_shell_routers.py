"""benchmarks/shell_routers.py: a benchmark stopped midway (Ctrl-C, or SIGTERM from `timeout` or
`kill`) takes down the deployment and routers it started."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from benchmarks import shell_routers


class _Stack:
    cluster_path = Path("cluster.json")

    def __init__(self) -> None:
        self.downs = 0

    def down(self) -> None:
        self.downs += 1


def test_sigterm_inside_a_benchmark_stops_its_deployment_and_routers(monkeypatch, tmp_path):
    stopped, stack = [], _Stack()
    monkeypatch.setattr(shell_routers, "make_stack", lambda *a, **k: stack)
    monkeypatch.setattr(shell_routers, "bring_up", lambda stack: {"models": {}})
    monkeypatch.setattr(
        shell_routers, "start_routers", lambda *a: ({"x": "http://r"}, [type("P", (), {"pid": 7})])
    )
    monkeypatch.setattr(shell_routers, "stop_group", stopped.append)
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(KeyboardInterrupt),
        shell_routers.routers_over_one_deployment("tree_3_1_cpu", tmp_path, {"x": {}}, 1, False),
    ):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
        raise AssertionError("SIGTERM did not interrupt the benchmark")
    assert stopped == [7] and stack.downs == 1
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_a_stopped_benchmark_says_so_in_one_line_after_its_deployment_is_down(
    monkeypatch, tmp_path, capsys
):
    stack = _Stack()
    monkeypatch.setattr(shell_routers, "make_stack", lambda *a, **k: stack)
    monkeypatch.setattr(shell_routers, "bring_up", lambda stack: {"models": {}})
    monkeypatch.setattr(shell_routers, "start_routers", lambda *a: ({"x": "http://r"}, []))
    rows = tmp_path / "rows.jsonl"
    with (
        pytest.raises(SystemExit) as stopped,
        shell_routers.one_line_on_interrupt(rows),
        shell_routers.routers_over_one_deployment("tree_3_1_cpu", tmp_path, {"x": {}}, 1, False),
    ):
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 130 and stack.downs == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "interrupted" in err and "nothing measured yet" in err  # no rows file of this run
    with pytest.raises(SystemExit), shell_routers.one_line_on_interrupt(rows):
        rows.write_text("{}\n")  # this run's first rows
        os.kill(os.getpid(), signal.SIGINT)
    assert f"the rows measured so far are in {rows}" in capsys.readouterr().err


def test_a_variants_config_copy_is_served_by_a_name_of_its_own(tmp_path):
    import json

    from router.config_loader import ConfigError, resolve_config_path

    src = resolve_config_path("tree_3_1_cpu")
    copy = shell_routers.edited_config(
        src, tmp_path, "tree_3_1_cpu-3-shortest", {"slot_order": "shortest_first"}
    )
    raw = json.loads(copy.read_text())
    assert raw["name"] == "tree_3_1_cpu-3-shortest" and raw["slot_order"] == "shortest_first"
    assert raw["agents"] == json.loads(src.read_text())["agents"]
    with pytest.raises(ConfigError, match="slot_order"):
        shell_routers.edited_config(src, tmp_path, "bad", {"slot_order": "random"})
