"""The warm-up gate's measured cost (issue 28): DecodeSlowdown reads how much warm-ups slow the
decode chunks beside them, and a shared ComputeDevice admits a warm-up only if its successor's
chance of being on the critical path pays for it."""

from __future__ import annotations

import json
import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router.cluster import ClusterError, load_cluster
from router.compute_device import ComputeDevice
from router.config_loader import load_config
from router.decode_slowdown import DecodeSlowdown
from router.metrics import RouterMetrics
from router.prefill_gate import PrefillGate
from router.topology import critical_path_chance


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


DT = 0.0005  # the simulation's time step, s


def simulate(meter, clock, seconds, step_s, slowdown, warm_when, streams=("s1", "s2")):
    """Decode `streams` in one batch for `seconds`: a step takes `step_s` alone and
    (1 + slowdown) × `step_s` while a warm-up is in flight; every stream's chunk arrives at the
    step's end. `warm_when(step_index)` -> a warm-up's duration to start right as that step's
    chunks arrived (the router sends warm-ups when chunks complete one), or None."""
    end, progress, steps, warm_until = clock.t + seconds, 0.0, 0, None
    while clock.t < end:
        warm = warm_until is not None
        progress += DT / (step_s * (1 + slowdown) if warm else step_s)
        clock.t += DT
        if warm and clock.t >= warm_until:
            meter.warmup_ended()
            warm_until = None
        if progress >= 1.0:
            progress -= 1.0
            for s in streams:
                meter.chunk(s)
            steps += 1
            if warm_until is None and (d := warm_when(steps)) is not None:
                meter.warmup_started()
                warm_until = clock.t + d
    if warm_until is not None:
        meter.warmup_ended()


def every(k: int, duration_s: float):
    return lambda step: duration_s if step % k == 0 else None


def measure(slowdown, warm_when, step_s=0.05, segments=10, segment_s=3.0):
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock)
    for _ in range(segments):
        simulate(meter, clock, segment_s, step_s, slowdown, warm_when)
        meter.disturbed()
    return meter


@pytest.mark.parametrize("slowdown", [0.0, 0.25, 1.0])
@pytest.mark.parametrize(
    "warm_when",
    [every(4, 0.5 * 0.05), every(3, 1.0 * 0.05), every(6, 3.0 * 0.05)],
    ids=["half-a-step", "one-step", "three-steps"],
)
def test_the_slowdown_is_read_whatever_the_warmups_length_and_their_timing(slowdown, warm_when):
    """Warm-ups start right as a step's chunks arrived, as the router sends them: shorter than a
    step, one step, several. The first version (chunks counted inside the warm-ups' windows) read
    0.49 on the real engine, and at half a step it counts no chunk inside any warm-up."""
    meter = measure(slowdown, warm_when)
    assert meter.segments == 10
    assert meter.slowdown() == pytest.approx(slowdown, abs=0.03 + 0.05 * slowdown)


def test_a_rate_change_between_segments_does_not_read_as_slowdown():
    """Segments are compared within themselves: fast steps in one, slow steps (a bigger batch)
    in the next, neither slowed by its warm-ups."""
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock)
    for _ in range(4):
        for step_s in (0.02, 0.2):
            simulate(meter, clock, 3.0, step_s, 0.0, every(3, step_s))
            meter.disturbed()
    assert meter.slowdown() == pytest.approx(0.0, abs=0.03)


def test_too_little_measured_is_unknown_and_a_segment_without_both_parts_is_skipped():
    meter = measure(0.5, every(3, 0.05), segments=3)
    assert meter.slowdown() is None  # 3 segments < min_segments
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock)
    simulate(meter, clock, 3.0, 0.05, 0.0, lambda step: None)  # no warm-up at all
    meter.disturbed()
    meter.warmup_started()  # warm throughout
    simulate(meter, clock, 3.0, 0.05, 0.5, lambda step: None)
    meter.disturbed()
    assert meter.segments == 0


def test_a_long_undisturbed_stretch_is_cut_into_segments():
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock, max_segment_s=2.0)
    simulate(meter, clock, 12.0, 0.05, 0.5, every(4, 0.1))  # never disturbed
    assert meter.segments >= 5
    assert meter.slowdown() == pytest.approx(0.5, abs=0.08)


def measured_device(slowdown: float | list[float], confidence: float = 0.95) -> ComputeDevice:
    """A device of two slots whose meter measured `slowdown` in 8 segments (a list: one
    segment after another at each of its slowdowns, in turn)."""
    clock = FakeClock()
    device = ComputeDevice("cpu", slots=2, confidence=confidence)
    device.slowdown = DecodeSlowdown(clock=clock)
    per_segment = slowdown if isinstance(slowdown, list) else [slowdown]
    for i in range(8):
        simulate(
            device.slowdown, clock, 3.0, 0.05, per_segment[i % len(per_segment)], every(3, 0.05)
        )
        device.slowdown.disturbed()
    mean = sum(per_segment) / len(per_segment)
    assert device.slowdown.slowdown() == pytest.approx(mean, abs=0.05)
    return device


def test_a_bound_is_the_estimate_shifted_by_its_noise():
    steady, noisy = measured_device(0.1), measured_device([0.0, 0.2])
    for device in (steady, noisy):
        assert device.slowdown.shifted(0.0) == pytest.approx(device.slowdown.slowdown())
    assert steady.slowdown.stderr() < 0.01
    assert steady.slowdown.shifted(1.645) == pytest.approx(0.1, abs=0.03)
    # Segments at 0 and 0.2: the same mean, a standard error of ~0.2 / 2 / √8 ≈ 0.035.
    noise = noisy.slowdown.stderr()
    assert noise == pytest.approx(0.035, abs=0.015)
    estimate = noisy.slowdown.slowdown()
    assert noisy.slowdown.shifted(1.645) == pytest.approx(estimate - 1.645 * noise)
    assert noisy.slowdown.shifted(-1.645) == pytest.approx(estimate + 1.645 * noise)
    assert noisy.slowdown.shifted(10.0) == 0.0  # never below 0


@pytest.mark.parametrize("confidence, admitted", [(0.05, False), (0.5, False), (0.95, True)])
def test_a_reading_within_its_noise_of_the_break_even_is_refused_unless_the_lower_bound(
    confidence, admitted
):
    """Four questions decoding and an aggregator's warm-up (1/3): the break-even is 0.083.
    Segments alternating 0 and 0.2 read ~0.09, within their noise of it: the estimate (the
    default) and the upper bound refuse, the lower 95% bound admits."""
    device = measured_device([0.0, 0.2], confidence)
    gate = PrefillGate()
    device.attach("http://p", gate)
    for q in ("q1", "q2", "q3", "q4"):
        device.decode_started("http://d", q)
    assert gate.is_open(benefit=1 / 3) is admitted
    assert gate.is_open(benefit=1.0)  # the final's: even the upper bound, ~0.15 × 4 ≤ 1


def test_a_steady_reading_above_the_break_even_refuses_at_any_confidence():
    device = measured_device(0.15, confidence=0.95)
    gate = PrefillGate()
    device.attach("http://p", gate)
    for q in ("q1", "q2", "q3", "q4"):
        device.decode_started("http://d", q)
    assert not gate.is_open(benefit=1 / 3)  # ≥ 0.13 × 4 > 1/3
    assert gate.is_open(benefit=1.0)


def test_a_warmup_is_admitted_only_if_its_benefit_pays_for_the_slowdown_of_every_question():
    device = measured_device(0.25)
    gate = PrefillGate()
    device.attach("http://p", gate)
    device.decode_started("http://d", "q1")
    device.decode_started("http://d", "q1")  # one question, two streams: charged once
    assert gate.is_open(benefit=1.0)  # the final: 0.25 × 1 ≤ 1
    assert gate.is_open(benefit=1 / 3)  # one of three aggregators: 0.25 ≤ 1/3
    device.decode_started("http://d", "q2")
    assert gate.is_open(benefit=1.0) and not gate.is_open(benefit=1 / 3)  # 0.5 > 1/3
    for q in ("q3", "q4", "q5"):
        device.decode_started("http://d", q)
    assert not gate.is_open(benefit=1.0)  # five questions: 1.25 > 1
    for q in ("q2", "q3", "q4", "q5"):
        device.decode_ended("http://d", q)
    assert gate.is_open(benefit=1 / 3)  # back to one question


def test_unmeasured_or_unweighed_devices_admit_by_slots_alone():
    device = ComputeDevice("cpu", slots=2)  # nothing measured yet
    gate = PrefillGate()
    device.attach("http://p", gate)
    for q in range(8):
        device.decode_started("http://d", q)
    assert gate.is_open(benefit=0.1)
    slowed = measured_device(2.0)
    slowed.weigh_slowdown = False
    other = PrefillGate()
    slowed.attach("http://p", other)
    slowed.decode_started("http://d", "q1")
    assert other.is_open(benefit=0.1)


def test_a_queued_warmup_the_device_refuses_does_not_hold_back_one_it_admits():
    device = measured_device(0.25)
    gate = PrefillGate()
    device.attach("http://p", gate)
    device.decode_started("http://d", "q1")
    device.decode_started("http://d", "q2")  # cost 0.5
    gate.queue((0, 0), benefit=1 / 3)  # first in line, but it does not pay
    assert not gate.try_enter((0, 0), benefit=1 / 3)
    assert gate.try_enter((0, 1), benefit=1.0)  # goes past it
    gate.leave()
    device.decode_ended("http://d", "q2")  # cost 0.25: the first pays now and goes first
    assert not gate.try_enter((0, 1), benefit=1.0)
    assert gate.try_enter((0, 0), benefit=1 / 3)


def test_warmups_through_a_device_gate_are_timed_by_its_meter():
    """The gate reports its warm-ups to the device's meter, the device its streams' chunks, and
    its changes (open streams, critical holds) as disturbances that end a segment."""
    clock = FakeClock()
    device = ComputeDevice("cpu", slots=2)
    device.slowdown = DecodeSlowdown(clock=clock)
    gate = PrefillGate()
    device.attach("http://p", gate)
    for _ in range(6):
        device.decode_started("http://d", "q1")
        for step in range(60):  # steps of 20 ms alone, 30 ms while a warm-up runs (0.5)
            warm = step % 3 == 2
            if warm:
                assert gate.try_enter()
            clock.t += 0.03 if warm else 0.02
            if warm:
                gate.leave()
            device.decode_chunk("stream")
        device.decode_ended("http://d", "q1", "stream")  # a disturbance: the segment ends
    assert device.slowdown.segments == 6
    assert device.slowdown.slowdown() == pytest.approx(0.5, abs=0.05)


def test_the_critical_path_chance_is_one_over_the_agents_of_a_layer():
    cfg = load_config("tree_9_3_1_cpu")
    assert critical_path_chance(cfg, "final") == 1.0
    aggregators = [a.id for a in cfg.agents if cfg.precursors(a.id) and a.id != "final"]
    assert len(aggregators) == 3
    assert [critical_path_chance(cfg, a) for a in aggregators] == pytest.approx([1 / 3] * 3)


def test_a_cluster_file_names_a_confidence_out_of_range(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"models": {}, "warmup_slowdown_confidence": 1.0}))
    with pytest.raises(ClusterError, match="warmup_slowdown_confidence") as e:
        load_cluster(path)
    assert "less than 1" in str(e.value)
    path.write_text(json.dumps({"models": {}}))
    assert load_cluster(path).warmup_slowdown_confidence == 0.5


def test_metrics_export_the_slowdown_and_the_bound_the_gate_weighs():
    metrics = RouterMetrics()
    metrics.watch_devices({"cpu": measured_device([0.0, 0.2]), "gpu0": ComputeDevice("gpu0", 1)})
    text = generate_latest(metrics.registry).decode()
    samples = {
        (s.name, s.labels["device"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("moa_device_warmup_decode_slowdown")
    }
    slowdown = samples[("moa_device_warmup_decode_slowdown", "cpu")]
    bound = samples[("moa_device_warmup_decode_slowdown_weighed", "cpu")]
    assert slowdown == pytest.approx(0.09, abs=0.03) and 0 <= bound < slowdown - 0.03
    assert math.isnan(samples[("moa_device_warmup_decode_slowdown_weighed", "gpu0")])


def test_a_step_of_n_streams_measures_what_n_chunks_do():
    """DecodeSlowdown.steps (the simulator's decode steps, simulation/gate.py) against a chunk
    per stream, on the same timeline: the same segments, estimate and standard error."""
    clocks = FakeClock(), FakeClock()
    by_chunk, by_step = (DecodeSlowdown(clock=c) for c in clocks)
    streams = ("s1", "s2", "s3")

    def at(t: float) -> None:
        clocks[0].t = clocks[1].t = t

    step_s, t = 0.05, 0.0
    for segment in range(6):
        slowdown = 0.2 + 0.05 * segment
        previous = None
        for step in range(40):
            warm = step % 5 == 2
            if warm:
                by_chunk.warmup_started()
                by_step.warmup_started()
            t += step_s * (1 + slowdown if warm else 1)
            at(t)
            if warm:
                by_chunk.warmup_ended()
                by_step.warmup_ended()
            for s in streams:
                by_chunk.chunk(s)
            if previous is not None:
                by_step.steps(previous, len(streams))  # each stream's first chunk: no gap
            previous = t
        for s in streams:
            by_chunk.stream_ended(s)
        by_chunk.disturbed()
        by_step.disturbed()
    assert by_chunk.segments == by_step.segments == 6
    assert by_step.slowdown() == pytest.approx(by_chunk.slowdown(), rel=1e-9)
    assert by_step.stderr() == pytest.approx(by_chunk.stderr(), rel=1e-9)
    assert 0.2 < by_step.slowdown() < 0.45


def test_a_reading_that_refuses_every_warmup_for_long_is_measured_again():
    """Under load a gate that refuses every warm-up gets no new segment (each needs a warm-up):
    once it has refused for remeasure_after_s with none admitted, the reading is forgotten,
    warm-ups are admitted by slots until a new one is measured, and the new reading decides
    (here: the slowdown fell, so they pay). A pause between refusals (another setting's block,
    no warm-up asked for) starts the count again."""
    clock = FakeClock()
    device = ComputeDevice("cpu", slots=2)
    device.slowdown = DecodeSlowdown(clock=clock, remeasure_after_s=60.0)
    for _ in range(6):
        simulate(device.slowdown, clock, 3.0, 0.05, 0.3, every(3, 0.05))
        device.slowdown.disturbed()
    gate = PrefillGate()
    device.attach("http://p", gate)
    for q in ("q1", "q2", "q3", "q4"):
        device.decode_started("http://d", q)

    def refusing_for(seconds: float) -> bool:
        """Ask every second for `seconds`; whether every ask was refused."""
        refused = True
        for _ in range(int(seconds)):
            refused &= not gate.is_open(benefit=1 / 3)
            clock.t += 1.0
        return refused

    assert refusing_for(40)  # ~0.3 × 4 > 1/3
    clock.t += 30.0  # a pause of 30 s without an ask: the count starts again...
    assert refusing_for(55)  # ...so 125 s after the first refusal it still refuses
    assert refusing_for(7)  # 61 s of refusals in a row...
    assert device.slowdown.slowdown() is None and device.slowdown.segments == 0
    assert gate.is_open(benefit=1 / 3)  # ...and it is forgotten: by slots alone again
    for _ in range(6):  # the warm-ups it admits measure the slowdown anew: 0.02 now
        simulate(device.slowdown, clock, 3.0, 0.05, 0.02, every(3, 0.05))
        device.slowdown.disturbed()
    assert device.slowdown.slowdown() == pytest.approx(0.02, abs=0.02)
    assert gate.is_open(benefit=1 / 3)  # ~0.02 × 4 ≤ 1/3
