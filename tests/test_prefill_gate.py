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
