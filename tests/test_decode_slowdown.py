"""The warm-up gate's measured cost (issue 28): DecodeSlowdown reads how much warm-ups slow the
decode chunks beside them, and a shared ComputeDevice admits a warm-up only if its successor's
chance of being on the critical path pays for it."""

from __future__ import annotations

import pytest

from router.compute_device import ComputeDevice
from router.config_loader import load_config
from router.decode_slowdown import DecodeSlowdown
from router.prefill_gate import PrefillGate
from router.topology import critical_path_chance


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def decode(meter: DecodeSlowdown, clock: FakeClock, seconds: float, step_s: float) -> None:
    """Decode chunks every `step_s` for `seconds`, mid-step (never on a boundary)."""
    start = clock.t
    for i in range(round(seconds / step_s)):
        clock.t = start + (i + 0.5) * step_s
        meter.chunk()
    clock.t = start + seconds


def run_segments(meter, clock, n, cold_step_s, warm_step_s, back_to_back=False):
    """`n` segments, each 1 s undisturbed then warm-ups over 0.5 s, a disturbance between."""
    for _ in range(n):
        decode(meter, clock, 1.0, cold_step_s)
        meter.warmup_started()
        if back_to_back:  # two warm-ups, the second entering as the first leaves
            decode(meter, clock, 0.25, warm_step_s)
            meter.warmup_ended()
            meter.warmup_started()
            decode(meter, clock, 0.25, warm_step_s)
        else:
            decode(meter, clock, 0.5, warm_step_s)
        meter.warmup_ended()
        meter.disturbed()


@pytest.mark.parametrize("back_to_back", [False, True])
def test_the_slowdown_is_the_ratio_of_decode_rates_with_and_without_warmups(back_to_back):
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock)
    assert meter.slowdown() is None
    # Decode steps of 20 ms alone, 25 ms beside a warm-up: 1.25× as long.
    run_segments(meter, clock, 8, 0.020, 0.025, back_to_back)
    assert meter.segments == 8
    assert meter.slowdown() == pytest.approx(0.25, abs=0.02)


def test_no_slowdown_reads_zero_and_noise_never_reads_below_it():
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock)
    run_segments(meter, clock, 8, 0.020, 0.020)
    assert meter.slowdown() == pytest.approx(0.0, abs=0.03)
    run_segments(meter, clock, 8, 0.020, 0.015)  # "faster" beside warm-ups: noise
    assert meter.slowdown() == 0.0


def test_a_rate_change_between_segments_does_not_read_as_slowdown():
    """Segments are compared within themselves: one with 9 streams (fast chunks) and one with 1
    (slow chunks), neither slowed by its warm-up, give no slowdown, though the warm part of the
    second has a lower rate than the cold part of the first."""
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock)
    for _ in range(4):
        run_segments(meter, clock, 1, 0.005, 0.005)
        run_segments(meter, clock, 1, 0.050, 0.050)
    assert meter.slowdown() == pytest.approx(0.0, abs=0.05)


def test_too_little_measured_is_unknown_and_a_segment_without_both_parts_is_skipped():
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock)
    run_segments(meter, clock, 3, 0.020, 0.040)
    assert meter.slowdown() is None  # 3 segments < min_segments
    # All warm (no cold part) then all cold: neither is a comparison.
    meter.warmup_started()
    decode(meter, clock, 1.0, 0.04)
    meter.disturbed()
    decode(meter, clock, 1.0, 0.02)
    meter.warmup_ended()
    meter.disturbed()
    assert meter.segments == 3


def test_a_long_undisturbed_stretch_is_cut_into_segments():
    clock = FakeClock()
    meter = DecodeSlowdown(clock=clock, max_segment_s=2.0)
    for _ in range(6):  # no disturbance at all: 1.5 s cycles, cut every 2 s
        decode(meter, clock, 1.0, 0.020)
        meter.warmup_started()
        decode(meter, clock, 0.5, 0.030)
        meter.warmup_ended()
    assert meter.segments >= 3
    assert meter.slowdown() == pytest.approx(0.5, abs=0.1)


def measured_device(slowdown_step_s: float) -> tuple[ComputeDevice, FakeClock]:
    """A device of two slots whose decodes took 20 ms a step alone and `slowdown_step_s` beside
    warm-ups."""
    clock = FakeClock()
    device = ComputeDevice("cpu", slots=2)
    device.slowdown = DecodeSlowdown(clock=clock)
    run_segments(device.slowdown, clock, 8, 0.020, slowdown_step_s)
    return device, clock


def test_a_warmup_is_admitted_only_if_its_benefit_pays_for_the_slowdown_of_every_question():
    device, _ = measured_device(0.025)  # slowdown 0.25
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
    slowed, _ = measured_device(0.060)  # slowdown 2.0
    slowed.weigh_slowdown = False
    other = PrefillGate()
    slowed.attach("http://p", other)
    slowed.decode_started("http://d", "q1")
    assert other.is_open(benefit=0.1)


def test_a_queued_warmup_the_device_refuses_does_not_hold_back_one_it_admits():
    device, _ = measured_device(0.025)  # slowdown 0.25
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
    """The gate reports its warm-ups to the device's meter and the device reports its changes
    (open streams, critical holds) as disturbances: a measured pair of parts per segment."""
    clock = FakeClock()
    device = ComputeDevice("cpu", slots=2)
    device.slowdown = DecodeSlowdown(clock=clock)
    gate = PrefillGate()
    device.attach("http://p", gate)
    for _ in range(6):
        device.decode_started("http://d", "q1")
        for _ in range(50):
            clock.t += 0.02
            device.decode_chunk()
        assert gate.try_enter()
        for _ in range(10):
            clock.t += 0.03
            device.decode_chunk()
        gate.leave()
        device.decode_ended("http://d", "q1")  # a disturbance: the segment ends
    assert device.slowdown.segments == 6
    assert device.slowdown.slowdown() == pytest.approx(0.5, abs=0.1)


def test_the_critical_path_chance_is_one_over_the_agents_of_a_layer():
    cfg = load_config("tree_9_3_1_cpu")
    assert critical_path_chance(cfg, "final") == 1.0
    aggregators = [a.id for a in cfg.agents if cfg.precursors(a.id) and a.id != "final"]
    assert len(aggregators) == 3
    assert [critical_path_chance(cfg, a) for a in aggregators] == pytest.approx([1 / 3] * 3)
