"""The per-agent endpoint's session store: expiry closes a session's agents (aborting their
requests), a request that leaves after its session was closed, shutdown."""

from __future__ import annotations

import asyncio

from router.cluster import Timeouts
from router.context import RouterContext
from router.sessions import SessionStore
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401

SLOW = {"decode": {"token_delay_s": 0.05}}
LINGER = Timeouts(read_s=10, warmup_s=10, precursor_wait_s=20, session_linger_s=0.05)


async def test_expiry_closes_the_session_and_aborts_its_agents(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, timeouts=LINGER, **SLOW)
    cfg = tree_config(max_new_tokens=500)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            store = SessionStore(ctx)
            s = store.enter("s", cfg, "q", "pipelined")
            task = s.start_agent("leaf_0_0")
            await asyncio.sleep(0.1)
            store.leave(s)  # its successor never comes
            for _ in range(100):
                if task.done() and s.apc.released:
                    break
                await asyncio.sleep(0.02)
            assert s.traces["leaf_0_0"].killed and len(store) == 0 and s.apc.released
            # A request for the same id now starts a fresh session with fresh rids.
            again = store.enter("s", cfg, "q", "pipelined")
            assert again is not s and again.rid_tag != s.rid_tag
            store.leave(again)
            await store.close()
        await asyncio.sleep(0.05)
        assert not cluster.decodes[0].active
    finally:
        await cluster.close()


async def test_a_request_leaving_after_shutdown(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, **SLOW)
    cfg = tree_config(max_new_tokens=500)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            store = SessionStore(ctx)
            s = store.enter("s", cfg, "q", "pipelined")
            s.start_agent("leaf_0_0")
            await asyncio.sleep(0.1)
            await store.close()  # the request is still inside
            store.leave(s)  # no KeyError: the store forgot the session
            assert len(store) == 0 and s.traces["leaf_0_0"].killed
        assert not cluster.decodes[0].active
    finally:
        await cluster.close()
