"""`moa-pd profile`'s pure parts: steady-state decode steps, knobs, model choice, pool sizing,
the profile's points and fits, the committed GPU anchors, and the CLI's bad-input errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from launch.cli import main
from profiling.decode_step import step_seconds
from profiling.knobs import CPU_KNOBS, GPU_KNOBS, knobs_from_args, parse_ints
from profiling.measure import ModelRun, PrefillSample, ProfileError
from profiling.profile_file import DecodePoint, ModelProfile, PDPoint, PrefillPoint, Profile
from profiling.run import choose_models, decode_pool_tokens, pool_concurrency
from router.config_loader import load_config
from tests.text_checks import said

ANCHORS = Path(__file__).resolve().parent.parent / "profiling" / "anchors"


def test_a_step_is_the_finish_time_difference_per_extra_token():
    # Three streams, each ending 0.2 s later in the run with 20 more tokens: 10 ms a step, the
    # outlier stream (a slow start in both runs) left out by the median.
    short, long = [0.30, 0.31, 0.90], [0.50, 0.51, 1.30]
    assert step_seconds(short, long, 20) == pytest.approx(0.010)
    assert step_seconds([0.5], [0.49], 20) < 0  # noise: decode_point repeats, then refuses
    with pytest.raises(ValueError):
        step_seconds([0.1], [0.2], 0)


def test_knobs_parse_and_refuse_bad_values():
    assert parse_ints("1024,256,256", "--x") == (256, 1024)
    with pytest.raises(argparse.ArgumentTypeError, match="--x"):
        parse_ints("a,b", "--x")
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
        parse_ints("0", "--x")
    ns = argparse.Namespace(reps=2, prompt_lengths=(16, 32))
    k = knobs_from_args(ns, gpu=False)
    assert (k.reps, k.prompt_lengths, k.decode_batches) == (2, (16, 32), CPU_KNOBS.decode_batches)
    assert knobs_from_args(argparse.Namespace(), gpu=True) == GPU_KNOBS
    assert max(GPU_KNOBS.prompt_lengths) == 4096 and max(GPU_KNOBS.decode_batches) == 32
    with pytest.raises(ValueError, match="--reps"):
        knobs_from_args(argparse.Namespace(reps=0), gpu=False)
    with pytest.raises(ValueError, match="two decode points"):
        knobs_from_args(argparse.Namespace(decode_batches=(1,), decode_contexts=(8,)), gpu=False)


def test_models_are_chosen_from_the_config_and_an_unknown_one_is_named():
    cfg = load_config("tree_9_3_1_mixed_cpu")
    assert choose_models(cfg, None) == ["smollm2", "gemma3"]
    assert choose_models(cfg, ["gemma3", "gemma3"]) == ["gemma3"]
    with pytest.raises(ProfileError, match="'llama'.*smollm2, gemma3"):
        choose_models(cfg, ["gemma3", "llama"])


def test_pool_concurrency_is_the_least_that_holds_the_decode_points():
    from planning.pool_need import pool_needs

    cfg = load_config("single_8b_dummy_gpu")
    tokens = decode_pool_tokens(GPU_KNOBS)
    c = pool_concurrency(cfg, ["qwen3-8b"], tokens)
    assert pool_needs([cfg], c)[("qwen3-8b", "decode")] >= tokens
    assert c == 1 or pool_needs([cfg], c - 1)[("qwen3-8b", "decode")] < tokens
    assert pool_concurrency(cfg, ["qwen3-8b"], 1) == 1


def test_the_profiles_deployment_admits_its_largest_decode_batch_at_once():
    """A decode worker that admitted fewer than a decode point's streams would time two waves of
    steps as one: the concurrency the profile starts its deployment for covers the batch too."""
    import json

    from planning.pool_need import running_needs
    from router.config_loader import config_from_dict, resolve_config_path

    cfg = load_config("tree_9_3_1_cpu")  # nine SmolLM2 agents in flight per question
    assert pool_concurrency(cfg, ["smollm2"], 1, streams=16) == 1  # the engine's default 16
    c = pool_concurrency(cfg, ["smollm2"], 1, streams=32)
    assert running_needs([cfg], c)["smollm2"] >= 32 > running_needs([cfg], c - 1)["smollm2"]
    assert pool_concurrency(cfg, ["smollm2"], 1, streams=512, backend="sglang") == 1

    raw = json.loads(resolve_config_path("tree_9_3_1_cpu").read_text())
    raw["models"]["smollm2"]["server_args"] = {"torch": {"max_running_requests": 8}}
    capped = config_from_dict(raw, "capped")
    with pytest.raises(ProfileError, match=r"smollm2\.server_args\.torch\.max_running_requests"):
        pool_concurrency(capped, ["smollm2"], 1, streams=16)


def _run(span: bool) -> ModelRun:
    run = ModelRun()
    for n, c, s in [(64, 0, 0.10), (64, 0, 0.12), (256, 0, 0.40), (64, 128, 0.15), (64, 128, 0.13)]:
        run.prefill.append(PrefillSample(n, c, s + 0.05, s if span else None))
    run.decode = [
        DecodePoint(batch=1, context=80, step_seconds=0.010),
        DecodePoint(batch=4, context=80, step_seconds=0.014),
        DecodePoint(batch=4, context=272, step_seconds=0.016),
    ]
    run.ttft = {64: [0.20, 0.22, 0.90], 256: [0.50]}
    return run


def test_model_run_takes_medians_and_derives_the_pd_fixed_cost():
    run = _run(span=True)
    assert run.uses_worker_span
    points = {(p.new_tokens, p.cached_tokens): p.seconds for p in run.prefill_points()}
    assert points == pytest.approx({(64, 0): 0.11, (256, 0): 0.40, (64, 128): 0.14})
    # TTFT minus the cold prefill at the same length: 0.09, 0.11, 0.79, 0.10 -> median 0.105
    assert run.pd_fixed_seconds() == pytest.approx(0.105)
    wall = _run(span=False)
    assert not wall.uses_worker_span
    assert wall.prefill_points()[0].seconds == pytest.approx(0.16)
    wall.ttft = {999: [1.0]}
    with pytest.raises(ProfileError, match="TTFT"):
        wall.pd_fixed_seconds()
    # Per length: 64 -> median(0.09, 0.11, 0.79) = 0.11; 256 -> 0.10.
    assert [(p.prompt_tokens, p.seconds) for p in run.pd_points()] == [
        (64, pytest.approx(0.11)),
        (256, pytest.approx(0.10)),
    ]
    # Where the worker reported each request's own prefill span, TTFT less that span is used
    # instead: the prefill's run-to-run noise stays out of the PD path.
    run.pd_path = {64: [0.06, 0.05, 0.07], 256: [0.12]}
    assert [(p.prompt_tokens, p.seconds) for p in run.pd_points()] == [
        (64, pytest.approx(0.06)),
        (256, pytest.approx(0.12)),
    ]
    assert run.pd_fixed_seconds() == pytest.approx(0.065)


def test_the_pd_path_is_a_fixed_part_plus_the_prompts_kv_bytes_over_a_bandwidth():
    base = {
        "model_path": "m",
        "weights_bytes": 1,
        "prefill": [
            PrefillPoint(new_tokens=n, cached_tokens=0, seconds=1e-3 * n) for n in (32, 384)
        ],
        "decode": [DecodePoint(batch=b, context=64, step_seconds=0.01 * b) for b in (1, 4)],
        "pd_fixed_seconds": 0.08,
    }
    kv, bandwidth, fixed = 46080, 200e6, 0.05  # bytes/token, bytes/s, s
    pd = [PDPoint(prompt_tokens=n, seconds=fixed + n * kv / bandwidth) for n in (32, 128, 384)]
    m = ModelProfile(kv_bytes_per_token=kv, pd=pd, **base)
    assert m.kv_transfer_bytes_per_second == pytest.approx(bandwidth)
    assert m.pd_seconds(1500) == pytest.approx(fixed + 1500 * kv / bandwidth)
    # No length-dependent part measured (noise around a constant), no points, or one length:
    # the fixed cost at every length, as profiles before the fit.
    flat = [PDPoint(prompt_tokens=n, seconds=s) for n, s in ((32, 0.09), (128, 0.08), (384, 0.085))]
    for pts in (flat, [], pd[:1]):
        m = ModelProfile(kv_bytes_per_token=kv, pd=pts, **base)
        assert m.kv_transfer_bytes_per_second is None
        assert m.pd_seconds(32) == m.pd_seconds(1500) == 0.08


def _assert_sane(profile: Profile) -> None:
    """Fits non-negative and monotone in every argument; the file round-trips."""
    for name, m in profile.models.items():
        pre = [m.prefill_seconds(n, c) for c in (0, 512, 2048) for n in (16, 256, 1024, 4096)]
        assert min(pre) >= 0, name
        for c in (0, 2048):
            row = [m.prefill_seconds(n, c) for n in (16, 256, 1024, 4096)]
            assert row == sorted(row), name
        assert m.prefill_seconds(256, 2048) >= m.prefill_seconds(256, 0)
        for ctx in (64, 1024, 4096):
            row = [m.decode_step_seconds(b, ctx) for b in (1, 4, 16, 64)]
            assert min(row) >= 0 and row == sorted(row), name
        assert m.decode_step_seconds(8, 4096) >= m.decode_step_seconds(8, 64)
        assert m.pd_fixed_seconds >= 0 and m.weights_bytes > 0 and m.kv_bytes_per_token > 0


@pytest.mark.parametrize("card", ["h200", "h100"])
def test_committed_gpu_anchors_are_valid_round_trip_and_say_what_is_derived(card, tmp_path):
    path = ANCHORS / f"gpu_anchor_qwen3_{card}.json"
    profile = Profile.load(path)
    assert profile.device.kind == "cuda" and card.upper() in profile.device.name
    assert set(profile.models) == {"qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-32b"}
    _assert_sane(profile)
    m8 = profile.models["qwen3-8b"]
    measured_1024 = {"h200": 0.029, "h100": 0.0292}[card]
    assert any(
        p.new_tokens == 1024 and p.seconds == pytest.approx(measured_1024) for p in m8.prefill
    )
    assert "DERIVED" in profile.models["qwen3-1.7b"].notes and "MEASURED" in m8.notes
    profile.dump(tmp_path / "again.json")
    assert Profile.load(tmp_path / "again.json") == profile


def test_cli_refuses_a_missing_config_and_an_unknown_model(tmp_path, capsys):
    out = str(tmp_path / "p.json")
    assert main(["profile", "--config", str(tmp_path / "nope.json"), "--out", out]) == 2
    assert "no such config" in said(capsys.readouterr().err)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["profile", "--config", str(bad), "--out", out]) == 2
    assert str(bad) in capsys.readouterr().err
    code = main(["profile", "--config", "tree_3_1_dummy_cpu", "--models", "x", "--out", out])
    assert code == 2
    assert "'x'" in capsys.readouterr().err
    assert not Path(out).exists()  # nothing written on bad input


def test_co_run_measurements_land_in_the_profiles_device(monkeypatch):
    from profiling import co_run
    from profiling.commands import with_co_run

    profile = Profile.load(Path(__file__).parent / "data" / "simulation" / "profile_cpu.json")
    fake = co_run.CoRun(2, {1: 1.0, 2: 0.9, 3: 0.55, 4: 0.42}, 0.11111, 0.05, (0.1, 0.12))
    monkeypatch.setattr(co_run, "measure", lambda progress=None: fake)
    measured = with_co_run(profile)
    assert measured.device.co_run_slowdown == 0.1111
    assert measured.device.oversubscribed_slowdown == 0.05
    assert measured.models == profile.models


def test_co_run_pairs_each_phase_with_alone_phases_so_a_drifting_machine_cancels_out():
    """A machine whose speed falls 2% a phase (a VM drifting): every k-phase compared with the
    alone-phases on either side gives the device model's rate exactly, in every round; compared
    with one alone-rate taken before (the earlier design) it would read a slowdown that is drift."""
    from profiling import co_run

    cores, beta = 2, 0.1
    model = {k: min(1, cores / k) / (1 + beta * (min(k, cores) - 1)) for k in range(1, 5)}
    calls: list[int] = []

    def drifting(k: int) -> float:
        calls.append(k)
        return model[k] * (1 - 0.02 * len(calls))

    ticks: list[None] = []
    rounds = co_run.paired_rates(drifting, cores, rounds=3, progress=lambda: ticks.append(None))
    assert calls[:7] == [1, 2, 1, 3, 1, 4, 1]  # alone between every k
    assert len(ticks) == len(calls) == co_run.phases(cores, 3)
    for relative in rounds:
        assert relative == {k: pytest.approx(model[k]) for k in model}
    assert co_run.fit(cores, rounds[-1]) == (pytest.approx(beta), pytest.approx(0.0, abs=1e-9))
    first_alone = drifting(1) / model[1]
    assert drifting(2) / first_alone < 0.97 * model[2]  # the drift the pairing removes


def test_co_run_measures_on_real_processes():
    """The micro-benchmark end to end on its own processes, as short as it goes: one core's
    worth (k = 1, 2), one round of 0.2-s phases."""
    from profiling import co_run

    result = co_run.measure(cores=1, seconds=0.2, rounds=1)
    assert set(result.rates) == {1, 2} and result.rates[1] == 1.0
    assert 0.2 < result.rates[2] < 1.2  # half each on one core, up to whole on two
    assert len(result.round_slowdowns) == 1 and result.co_run_slowdown == 0.0  # no k in 2..cores
