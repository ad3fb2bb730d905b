"""The Agent Prompt Cache: growth, waits, following an agent, and release."""

from __future__ import annotations

import asyncio

import pytest

from router.answer_cache import AnswerCache, SessionReleased


async def test_wait_for_returns_when_enough_tokens_arrive():
    apc = AnswerCache(["a"])

    async def feed():
        for t in range(5):
            await asyncio.sleep(0)
            apc.append("a", [t], [-0.1], f"t{t}")

    feeder = asyncio.create_task(feed())
    answer = await asyncio.wait_for(apc.wait_for("a", 3), 1)
    assert len(answer.output_ids) >= 3
    await feeder
    assert apc["a"].output_ids == [0, 1, 2, 3, 4] and apc["a"].text == "t4"


async def test_wait_for_returns_when_the_agent_ends_short():
    apc = AnswerCache(["a"])
    asyncio.get_running_loop().call_soon(apc.fail, "a", "boom")
    answer = await asyncio.wait_for(apc.wait_for("a", 10), 1)
    assert answer.error == "boom" and answer.ended


async def test_wait_change_times_out():
    apc = AnswerCache(["a"])
    with pytest.raises(TimeoutError):
        await apc.wait_change(apc.version, timeout=0.05)


async def test_finish_order_and_release():
    apc = AnswerCache(["a", "b"])
    apc.append("b", [1], [0.0], "x")
    apc.finish("b")
    apc.finish("a")
    assert (apc["b"].finish_seq, apc["a"].finish_seq) == (0, 1)
    apc.release()
    assert apc["b"].output_ids == [] and apc["b"].text == ""


async def test_release_fails_waiters_instead_of_leaving_them_hanging():
    apc = AnswerCache(["a"])
    apc.append("a", [1], [0.0], "x")
    waiter = asyncio.create_task(apc.wait_for("a", 10))
    follower = asyncio.create_task(anext(aiter(apc.follow("a")), None))
    await asyncio.sleep(0)
    apc.release()
    with pytest.raises(SessionReleased):
        await asyncio.wait_for(waiter, 1)
    assert await follower == ([1], [0.0], "x")  # what was there before the release
    with pytest.raises(SessionReleased):
        await asyncio.wait_for(apc.wait_change(apc.version), 1)


async def test_wait_ended_rereads_the_set_and_returns_on_a_failure():
    apc = AnswerCache(["a", "b", "c"])
    wanted = {"a", "b"}
    waiter = asyncio.create_task(apc.wait_ended(lambda: sorted(wanted), 1))
    apc.finish("a")
    await asyncio.sleep(0)
    assert not waiter.done()
    wanted.discard("b")  # early exit dropped b
    apc.touch()
    await asyncio.wait_for(waiter, 1)
    # A failed agent ends the wait at once, though the others still run.
    await asyncio.wait_for(asyncio.create_task(_fail_soon(apc)), 1)


async def _fail_soon(apc: AnswerCache) -> None:
    asyncio.get_running_loop().call_soon(apc.fail, "b", "boom")
    await apc.wait_ended(lambda: ["b", "c"])
    assert apc["b"].error == "boom" and not apc["c"].ended


async def test_follow_yields_new_tokens_until_the_agent_ends():
    apc = AnswerCache(["a"])

    async def feed():
        for t in range(3):
            await asyncio.sleep(0)
            apc.append("a", [t], [-0.1 * t], f"t{t}")
        apc.finish("a")

    feeder = asyncio.create_task(feed())
    got = [x async for x in apc.follow("a")]
    await feeder
    assert [i for ids, _, _ in got for i in ids] == [0, 1, 2] and got[-1][2] == "t2"


async def test_a_scoped_wait_wakes_for_its_agents_and_touches_only():
    """Every token of every agent changes a session's APC: a wait names the agents it is about,
    and other agents' tokens leave it asleep (the router's CPU under load, issue 28)."""
    apc = AnswerCache(["a", "b", "c"])
    watch = ["a", "b"]
    waiter = asyncio.create_task(apc.wait_change(apc.changes(watch), 1, watch))
    for t in range(50):
        apc.append("c", [t], [0.0], "")
        await asyncio.sleep(0)
    assert not waiter.done()
    apc.append("b", [1], [0.0], "")
    assert await asyncio.wait_for(waiter, 1) == apc.changes(watch)
    # A change outside every entry (a dropped slot, a routing decision) wakes every scope.
    waiter = asyncio.create_task(apc.wait_change(apc.changes(["a"]), 1, ["a"]))
    await asyncio.sleep(0)
    apc.touch()
    await asyncio.wait_for(waiter, 1)
    # An unscoped wait still wakes on any change.
    waiter = asyncio.create_task(apc.wait_change(apc.changes()))
    await asyncio.sleep(0)
    apc.append("c", [0], [0.0], "")
    await asyncio.wait_for(waiter, 1)


async def test_a_wait_on_several_agents_leaves_no_waiter_behind():
    """A waiter sits in the set of each agent it watches; woken by one or timed out, it is
    gone from all, so an agent that never changes again collects nothing."""
    apc = AnswerCache(["a", "b"])
    apc.finish("a")
    for t in range(100):  # a successor of a (ended) and b waits once per token of b
        waiter = asyncio.create_task(apc.wait_change(apc.changes(["a", "b"]), 1, ["a", "b"]))
        await asyncio.sleep(0)
        apc.append("b", [t], [0.0], "")
        await asyncio.wait_for(waiter, 1)
    with pytest.raises(TimeoutError):
        await apc.wait_change(apc.changes(["a"]), 0.01, ["a"])
    assert not any(apc._waiters.values())


async def test_follow_and_wait_for_are_not_woken_by_other_agents():
    apc = AnswerCache(["a", "b"])
    wakes = 0
    wait_change = apc.wait_change

    async def counted(*args, **kwargs):
        nonlocal wakes
        wakes += 1
        return await wait_change(*args, **kwargs)

    apc.wait_change = counted
    waiter = asyncio.create_task(apc.wait_for("a", 2))
    await asyncio.sleep(0)
    for t in range(30):
        apc.append("b", [t], [0.0], "")
        await asyncio.sleep(0)
    apc.append("a", [1], [0.0], "")
    await asyncio.sleep(0)
    apc.append("a", [2], [0.0], "")
    assert len((await asyncio.wait_for(waiter, 1)).output_ids) == 2
    assert wakes == 2  # one wait per token of a, none for b's 30
