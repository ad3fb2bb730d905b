"""Workflow priority (router/priority.py): the `priority` values requests carry, the order of
warm-ups at a prefill worker's gate, and both through the shell router on fake workers."""

from __future__ import annotations

import asyncio

from router.context import RouterContext
from router.orchestrator import Session
from router.prefill_gate import PrefillGate, hold
from router.priority import CLASS_SPAN, RequestOrder
from sglang_ext import protocol as P
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401


def test_fcfs_has_two_classes_and_workflow_ranks_older_questions_first():
    fcfs = RequestOrder()
    assert {fcfs.value(True, q) for q in (None, 0, 7)} == {P.PRIORITY_CRITICAL}
    assert {fcfs.value(False, q) for q in (None, 0, 7)} == {P.PRIORITY_WARMUP}
    order = RequestOrder(workflow=True)
    assert [order.next_question() for _ in range(3)] == [0, 1, 2]
    # Larger goes first (SGLang's default): an older question's requests above a newer one's.
    assert order.value(True, 0) > order.value(True, 1) > order.value(True, 10**9)
    assert order.value(False, 0) > order.value(False, 1)
    # Every critical request above every warm-up, for any two questions in range.
    assert order.value(True, CLASS_SPAN - 1) > order.value(False, 0)
    assert order.value(True, None) == P.PRIORITY_CRITICAL  # a question not numbered
    assert max(abs(order.value(c, 0)) for c in (True, False)) < 2**53  # exact in JSON


async def _enter_in_turn(gate: PrefillGate, key: tuple[int, int], entered: list) -> None:
    """As router/incremental.py's WarmupLoop: try, else queue and wait for a change."""
    while not gate.try_enter(key):
        gate.queue(key)
        await gate.wait_change()
    entered.append(key)
    await asyncio.sleep(0.01)
    gate.leave()


async def test_queued_warmups_enter_by_key_when_the_gate_opens():
    gate, entered = PrefillGate(max_warmups_in_flight=1), []
    critical = hold([gate])
    keys = [(5, 0), (1, 2), (1, 1), (3, 3)]
    tasks = [asyncio.create_task(_enter_in_turn(gate, k, entered)) for k in keys]
    await asyncio.sleep(0.02)
    assert entered == []
    critical.release()
    await asyncio.gather(*tasks)
    assert entered == sorted(keys)
    assert gate.warmups_in_flight == 0 and not gate._queued


async def test_a_warmup_that_leaves_the_queue_lets_the_next_one_in():
    gate, entered = PrefillGate(max_warmups_in_flight=1), []
    critical = hold([gate])
    gate.queue((0, 0))  # ready, then no longer (its prompt has nothing new to send)
    waiting = asyncio.create_task(_enter_in_turn(gate, (1, 1), entered))
    critical.release()
    await asyncio.sleep(0.02)
    assert entered == []  # (0, 0) goes first while it is queued
    gate.unqueue((0, 0))
    await asyncio.wait_for(waiting, 1)
    assert entered == [(1, 1)]


async def _two_questions(spec) -> list[dict]:
    """Two 3-1 questions at once, the first started first; every request the workers got."""
    cluster_spec, cluster = spec
    async with RouterContext.open(cluster_spec) as ctx:
        cfg = tree_config(max_new_tokens=20)
        first = Session(ctx, cfg, "What is 2+3?", "pipelined")
        second = Session(ctx, cfg, "What is 4+5?", "pipelined")
        assert (first.arrival, second.arrival) == (0, 1)
        await asyncio.gather(first.run_all(), second.run_all())
        tags = {first.rid_tag: 0, second.rid_tag: 1}
    out = []
    for w in [*cluster.prefills, *cluster.decodes]:
        for r in w.requests:
            question = next(q for tag, q in tags.items() if tag in r[P.RID])
            warm = r[P.RID].startswith(P.WARMUP_RID_PREFIX)
            out.append({"question": question, "warmup": warm, "priority": r.get(P.PRIORITY)})
    return out


async def test_the_router_sends_workflow_priorities(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, decode={"token_delay_s": 0.002})
    try:
        spec = cluster.spec.model_copy(
            update={"priority_scheduling": True, "workflow_priority": True}
        )
        reqs = await _two_questions((spec, cluster))
        order = RequestOrder(workflow=True)
        for r in reqs:
            assert r["priority"] == order.value(not r["warmup"], r["question"]), r
        assert {r["question"] for r in reqs if r["warmup"]} == {0, 1}
        for w in cluster.workers():
            w.requests.clear()
        spec = cluster.spec.model_copy(update={"priority_scheduling": True})
        fcfs = await _two_questions((spec, cluster))
        assert {(r["warmup"], r["priority"]) for r in fcfs} == {
            (False, P.PRIORITY_CRITICAL),
            (True, P.PRIORITY_WARMUP),
        }
    finally:
        await cluster.close()
