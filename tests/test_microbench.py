"""The microbench's pure parts: prompt sampling, warm-up chunking, row schema, normalization to PD,
and its command line. No worker is started."""

import argparse
import signal

import pytest

from benchmarks import microbench as mb
from benchmarks.microbench_deploy import kv_tokens
from planning.types import WorkerDemand, WorkerPlacement


def test_prompts_are_seeded_in_range_and_uniform_lengths():
    a = mb.sample_prompts(200, 64, 1000, seed=3)
    assert a == mb.sample_prompts(200, 64, 1000, seed=3)
    assert a != mb.sample_prompts(200, 64, 1000, seed=4)
    lengths = [len(p) for p in a]
    assert min(lengths) >= 1 and max(lengths) <= 64
    assert len(set(lengths)) > 30  # spread over the range, not one fixed length
    assert all(mb.LOW_TOKEN_ID <= t < 1000 for p in a for t in p)


@pytest.mark.parametrize("bad", [(0, 8, 1000), (3, 0, 1000), (3, 8, mb.LOW_TOKEN_ID)])
def test_prompt_sampling_rejects_bad_sizes(bad):
    with pytest.raises(ValueError):
        mb.sample_prompts(*bad, seed=0)


def test_warm_prefixes_stop_before_the_tail():
    assert mb.warm_prefix_lengths(1, 128) == []
    assert mb.warm_prefix_lengths(128, 128) == []
    assert mb.warm_prefix_lengths(129, 128) == [128]
    assert mb.warm_prefix_lengths(300, 100) == [100, 200]
    with pytest.raises(ValueError):
        mb.warm_prefix_lengths(10, 0)


def test_row_schema_is_what_the_figure_reads():
    row = mb.make_row("pd", 17, 1.5, 0.25, 0, prompt_index=2)
    assert set(mb.ROW_KEYS) <= set(row)
    assert row["prompt_tokens"] == 17 and row["ttft_s"] == 0.25
    with pytest.raises(ValueError):
        mb.make_row("dp3", 17, 1.5, None, 0, prompt_index=0)


def test_medians_are_normalized_to_plain_pd():
    rows = []
    for i, (pd, inc) in enumerate([(2.0, 1.0), (4.0, 3.0), (6.0, 3.0)]):
        rows += [
            mb.make_row("pd", 10, pd, 0.1, 0, i),
            mb.make_row("incremental", 10, inc, None, 8, i),
        ]
    summary = {s["variant"]: s for s in mb.normalized_medians(rows)}
    assert summary["pd"]["vs_pd"] == 1.0
    assert summary["incremental"]["vs_pd"] == pytest.approx(3.0 / 4.0)
    assert summary["incremental"]["paired_vs_pd"] == pytest.approx(0.5)  # of 0.5, 0.75, 0.5
    assert summary["incremental"]["median_ttft_s"] is None
    assert summary["incremental"]["mean_cached_tokens"] == 8
    table = mb.format_table(list(summary.values()))
    assert "| incremental | 3 |" in table
    with pytest.raises(ValueError):
        mb.normalized_medians([mb.make_row("dp2", 10, 1.0, None, 0, 0)])


def test_kv_pool_holds_two_sequences():
    assert kv_tokens(100) == 2048
    assert kv_tokens(1056) == 2304 and kv_tokens(1056) >= 2 * 1056


def test_cli_is_its_own_with_cpu_defaults():
    from launch.cli import COMMANDS

    # `python -m benchmarks.microbench`, not a `moa-pd` subcommand: the product never imports it.
    assert "microbench" not in COMMANDS
    p = argparse.ArgumentParser()
    mb.add_arguments(p)
    args = p.parse_args(["--out", "x"])
    assert (args.num_prompts, args.output_len, args.max_len) == (12, 32, 1024)


def test_cli_passes_its_flags_to_main_and_stops_on_sigterm_as_on_ctrl_c(monkeypatch):
    seen = []
    monkeypatch.setattr(mb, "main", lambda args: seen.append(args) or 0)
    term, intr = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert mb.cli(["--out", "x", "--variants", "pd", "--backend", "sglang"]) == 0
        assert (seen[0].out, seen[0].variants, seen[0].backend) == ("x", ("pd",), "sglang")
        with pytest.raises(KeyboardInterrupt):  # the Deployment's __exit__ stops its workers
            signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGINT, intr)


def test_variants_must_be_known_and_include_the_pd_baseline():
    assert mb.parse_variants("pd,incremental") == ("incremental", "pd")  # in VARIANTS order
    for bad in ("incremental", "pd,dp3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="including pd"):
            mb.parse_variants(bad)
    p = argparse.ArgumentParser()
    mb.add_arguments(p)
    args = p.parse_args(["--out", "x", "--backend", "sglang", "--variants", "incremental,pd"])
    assert args.backend == "sglang" and args.variants == ("incremental", "pd")


def test_sglang_workers_get_the_cpu_path_of_moa_pd_up_or_a_gpu(tmp_path):
    from benchmarks.microbench_deploy import worker_spec
    from sglang_ext.sglang_backend import cpu

    args = {"max_total_tokens": 2304, "context_length": 2048}
    spec = worker_spec("pd.decode", str(tmp_path), "decode", "127.0.0.1", args, "sglang")
    argv = spec.argv
    assert argv[argv.index("--backend") + 1] == "sglang"
    assert argv[-len(cpu.worker_flags("decode")) :] == cpu.worker_flags("decode")
    assert argv.count("--max-total-tokens") == 1  # the CPU path's own pool size only
    assert spec.env["SGLANG_USE_CPU_ENGINE"] == "1"
    # Placed on GPU 3: it sees only that GPU (in nvidia-smi's order), as its device 0.
    demand = WorkerDemand("pd.prefill", "worker", 0, 1, 1 << 30, 1 << 17, 2304)
    placed = WorkerPlacement(demand, (3,), 2304, 0, 0.5)
    on_gpu = worker_spec(
        "pd.prefill", str(tmp_path), "prefill", "127.0.0.1", args, "sglang", placed=placed
    )
    assert on_gpu.argv[on_gpu.argv.index("--base-gpu-id") + 1] == "0"
    assert on_gpu.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert on_gpu.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "--device" not in on_gpu.argv and "SGLANG_USE_CPU_ENGINE" not in on_gpu.env
    ref = worker_spec("dp0", str(tmp_path), "null", "127.0.0.1", args)
    assert ref.argv[ref.argv.index("--max-total-tokens") + 1] == "2304"
    assert "--device" not in ref.argv
