"""The Agent Prompt Cache: growth, waits and release."""

from __future__ import annotations

import asyncio

import pytest

from router.answer_cache import AnswerCache


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
