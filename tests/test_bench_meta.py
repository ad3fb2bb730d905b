"""A benchmark report names the command that reproduces it and the load around it."""

from benchmarks.bench_meta import BenchRun, provenance


def test_command_is_the_module_and_its_quoted_arguments():
    bench = BenchRun("benchmarks.bench_overlap", argv=["--config", "my tree.json", "--pin-cpus"])
    assert bench.command == "python -m benchmarks.bench_overlap --config 'my tree.json' --pin-cpus"
    assert BenchRun("experiments.x", argv=[]).command == "python -m experiments.x"


def test_meta_takes_the_load_at_start_and_at_end():
    bench = BenchRun("experiments.x", argv=[], load_before="9.00 9.00 9.00")
    meta = bench.meta(config="c")
    assert meta["config"] == "c" and meta["load_before"] == "9.00 9.00 9.00"
    assert len(meta["load_after"].split()) == 3
    assert provenance(meta).startswith(
        "Command: `python -m experiments.x`; load average before 9.00"
    )
