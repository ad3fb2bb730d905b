"""PrefillGate: warm-ups wait while a critical prefill is outstanding and at most one is in
flight; holds release once."""

from __future__ import annotations

import asyncio

from router.prefill_gate import PrefillGate, hold


async def test_warmup_waits_for_critical_holds_and_the_in_flight_cap():
    gate, order = PrefillGate(max_warmups_in_flight=1), []

    async def warm(name: str, hold_s: float) -> None:
        async with gate.warmup():
            order.append(f"{name}+")
            await asyncio.sleep(hold_s)
            order.append(f"{name}-")

    first = hold([gate])
    second = hold([gate])
    w1 = asyncio.create_task(warm("w1", 0.02))
    w2 = asyncio.create_task(warm("w2", 0.0))
    await asyncio.sleep(0.02)
    assert order == [] and gate.critical == 2
    first.release()
    first.release()  # idempotent: the second hold still counts
    await asyncio.sleep(0.02)
    assert order == [] and gate.critical == 1
    second.release()
    await asyncio.gather(w1, w2)
    # One warm-up at a time, never overlapping.
    assert order in (["w1+", "w1-", "w2+", "w2-"], ["w2+", "w2-", "w1+", "w1-"])
    assert gate.warmups_in_flight == 0 and gate.is_open()


async def test_a_hold_spans_several_gates():
    gates = [PrefillGate(), PrefillGate()]
    h = hold(gates)
    assert not any(g.try_enter() for g in gates)
    h.release()
    assert all(g.try_enter() for g in gates)
    assert not gates[0].try_enter()  # the cap of one warm-up in flight


async def test_a_shared_device_admits_a_warmup_only_into_a_free_slot():
    """Two prefill workers and a decode worker on a device of two slots (four workers on two
    cores, as tree_9_3_1_mixed_cpu): a warm-up goes only where it takes no slot from a decode."""
    from router.compute_device import ComputeDevice

    device = ComputeDevice("cpu", slots=2)
    a, b = PrefillGate(), PrefillGate()
    device.attach("http://a", a)
    device.attach("http://b", b)
    device.decode_started("http://d1", "q1")
    assert a.try_enter()  # busy: d1 and a, two slots
    assert not b.is_open()  # b would be the third busy worker
    a.leave()
    device.decode_started("http://d2", "q1")  # two decodes fill the device
    assert not a.is_open() and not b.is_open()

    entered = asyncio.Event()

    async def warm() -> None:
        async with b.warmup():
            entered.set()

    task = asyncio.create_task(warm())
    await asyncio.sleep(0.01)
    assert not entered.is_set()
    device.decode_ended("http://d1", "q1")  # a decode ending wakes the waiting warm-up
    await asyncio.wait_for(task, 1.0)
    assert entered.is_set()
    # A critical prefill holds a slot too, and a worker already busy fits in its own slot.
    device.decode_ended("http://d2", "q1")
    held = hold([a])
    assert not a.is_open()  # its own critical prefill, as before
    assert b.is_open()  # busy: a (critical) and b
    device.decode_started("http://d1", "q1")
    assert not b.is_open()
    held.release()
    assert b.is_open()
