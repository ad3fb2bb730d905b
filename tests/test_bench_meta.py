"""A benchmark report names the command that reproduces it, the load around it and the machine's
speed before and after."""

import pytest

from benchmarks.bench_meta import BenchRun, provenance
from benchmarks.machine_speed import decode_pass_ms, main


def test_command_is_the_module_and_its_quoted_arguments():
    bench = BenchRun(
        "benchmarks.bench_overlap",
        argv=["--config", "my tree.json", "--pin-cpus"],
        speed_before=None,
    )
    assert bench.command == "python -m benchmarks.bench_overlap --config 'my tree.json' --pin-cpus"
    assert (
        BenchRun("experiments.x", argv=[], speed_before=None).command == "python -m experiments.x"
    )


def test_meta_takes_the_load_at_start_and_at_end():
    bench = BenchRun("experiments.x", argv=[], load_before="9.00 9.00 9.00", speed_before=None)
    meta = bench.meta(config="c")
    assert meta["config"] == "c" and meta["load_before"] == "9.00 9.00 9.00"
    assert len(meta["load_after"].split()) == 3
    assert "decode_pass_ms_before" not in meta
    assert provenance(meta) == (
        f"Command: `python -m experiments.x`; load average before 9.00 9.00 9.00, "
        f"after {meta['load_after']}."
    )


def test_the_speed_probe_is_taken_at_start_and_at_end():
    bench = BenchRun("experiments.x", argv=[])
    meta = bench.meta()
    assert meta["decode_pass_ms_before"] > 0 and meta["decode_pass_ms_after"] > 0
    assert (
        f"decode-shaped pass (benchmarks/machine_speed.py) {meta['decode_pass_ms_before']} ms "
        f"before, {meta['decode_pass_ms_after']} ms after." in provenance(meta)
    )


def test_a_deeper_pass_takes_longer():
    # The probe times the weights it is given: 30 layers of SmolLM2's shapes against 3 (medians
    # of 5; a factor of 10 in work leaves room for any noise).
    assert decode_pass_ms(layers=30) > decode_pass_ms(layers=3)


def test_the_probe_prints_its_time_and_refuses_a_pass_of_nothing(capsys):
    assert main(["--passes", "2", "--layers", "2"]) == 0
    assert "decode-shaped pass (2 layers, median of 2):" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--layers", "0"])
    assert "--layers must be at least 1" in capsys.readouterr().err


def test_a_run_stopped_before_its_end_says_so():
    bench = BenchRun("experiments.x", argv=[], load_before="1.00 1.00 1.00", speed_before=42.0)
    started = bench.started(config="c")
    assert started == {
        "command": "python -m experiments.x",
        "load_before": "1.00 1.00 1.00",
        "decode_pass_ms_before": 42.0,
        "config": "c",
    }
    assert provenance(started) == (
        "Command: `python -m experiments.x`; load average before 1.00 1.00 1.00, after not "
        "recorded (the run stopped before its end); a decode-shaped pass "
        "(benchmarks/machine_speed.py) 42.0 ms before, after not recorded (the run stopped "
        "before its end)."
    )
