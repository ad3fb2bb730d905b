"""The warm-up loop against a fake prefill worker: chunk policies, one warm-up in flight, every
warm-up a cache hit on the one before, an empty static prefix, warm-ups that fail or time out."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from types import SimpleNamespace
from unittest.mock import Mock

import pytest

from router.answer_cache import AnswerCache
from router.cluster import Timeouts
from router.config import IncrementalPrefill
from router.context import RouterContext
from router.incremental import WarmupLoop, next_warmup
from router.prefill_gate import hold
from router.sglang_client import WorkerError
from router.successor_prompt import SuccessorPrompt, token_source
from router.template import PromptPieces, build_pieces
from router.trace import AgentTrace, Clock
from sglang_ext import protocol as P
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster  # noqa: F401
from tests.test_router_template import AGG

# Any new token is worth a warm-up: the self-clocking alone decides how much each one carries.
ADAPTIVE = IncrementalPrefill(min_chunk_tokens=1)


@contextlib.asynccontextmanager
async def one_successor(tok_path, agents=("a", "b", "c"), prefill_s_per_token: float = 0.0):
    """A fake cluster (its prefill worker taking `prefill_s_per_token` a new token) and one
    successor "agg" of precursors a, b, c (an APC holding `agents`; `dropped`, its dropped
    slots), its prefill target picked: what a WarmupLoop needs."""
    cluster = await start_fake_cluster(
        tok_path, prefill={"prefill_s_per_token": prefill_s_per_token}
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            tok = ctx.tokenizer("smollm2")
            apc, dropped = AnswerCache(list(agents)), set()
            pieces = build_pieces(tok, AGG, "q?")
            prompt = SuccessorPrompt(
                "agg", pieces, {s: token_source(tok.eot_ids) for s in "abc"}, apc, dropped
            )
            dep = ctx.deployments["smollm2"]
            yield SimpleNamespace(
                cluster=cluster,
                apc=apc,
                dropped=dropped,
                pieces=pieces,
                prompt=prompt,
                dep=dep,
                target=dep.pick_prefill(),
                trace=AgentTrace(model="smollm2", layer=2),
            )
    finally:
        await cluster.close()


async def until(condition, tries: int = 100) -> None:
    """Poll `condition` every 10 ms, at most `tries` times (the caller asserts what it needs)."""
    for _ in range(tries):
        if condition():
            return
        await asyncio.sleep(0.01)


def end_with_one_token(apc: AnswerCache, agents: str) -> None:
    for agent in agents:
        apc.append(agent, [7], [0.0], "")
        apc.finish(agent)


def test_next_warmup_policies():
    warmed, ready = [1, 2, 3], [1, 2, 3, 4, 5, 6, 7]
    assert next_warmup(warmed, ready, ADAPTIVE) == ready
    assert next_warmup(ready, ready, ADAPTIVE) is None
    # Adaptive waits until a step is worth it, then carries everything that arrived.
    worth_4 = IncrementalPrefill(min_chunk_tokens=4)
    assert next_warmup(warmed, ready[:6], worth_4) is None
    assert next_warmup(warmed, ready, worth_4) == ready
    # The last one before a precursor's cap carries whatever is new.
    assert next_warmup(warmed, ready[:4], worth_4, last=True) == ready[:4]
    assert next_warmup(ready, ready, worth_4, last=True) is None
    # Counted from the longest valid prefix: a dropped slot makes the stale tail new again.
    assert next_warmup([1, 2, 9, 9, 9], ready, worth_4) == ready
    fixed = IncrementalPrefill(chunk_policy="fixed", chunk_tokens=3)
    assert next_warmup(warmed, ready, fixed) == [1, 2, 3, 4, 5, 6]
    assert next_warmup(warmed, ready[:5], fixed) is None
    # A dropped slot invalidated the warmed tail: re-extend from the longest valid prefix.
    assert next_warmup([1, 2, 9, 9], [1, 2, 3, 4, 5], fixed) == [1, 2, 3, 4, 5]


async def run_loop(
    tok_path, policy, feed_delay_s, prefill_s_per_token=0.0, pieces=None, verb="generate"
):
    cluster = await start_fake_cluster(
        tok_path, prefill={"prefill_s_per_token": prefill_s_per_token}, warmup_verb=verb
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            tok = ctx.tokenizer("smollm2")
            apc = AnswerCache(["a", "b", "c"])
            pieces = pieces or build_pieces(tok, AGG, "q?")
            prompt = SuccessorPrompt(
                "agg", pieces, {s: token_source(tok.eot_ids) for s in "abc"}, apc, set()
            )
            dep = ctx.deployments["smollm2"]
            target = dep.pick_prefill()
            trace = AgentTrace(model="smollm2", layer=2)
            cached: list[int] = []
            loop = WarmupLoop(
                prompt,
                apc,
                dep,
                target,
                policy,
                trace,
                Clock(),
                "moa-warm-t-",
                5.0,
                lambda _n, meta: cached.append(meta[P.CACHED_TOKENS]),
            )

            async def feed():
                for agent in "abc":
                    for t in range(40):
                        apc.append(agent, [1000 + t], [0.0], "")
                        await asyncio.sleep(feed_delay_s)
                    apc.finish(agent)

            feeder = asyncio.create_task(feed())
            ids = await loop.run()
            await loop.settle()
            await feeder
            # `cached`: what each warm-up reported, in order.
            return ids, trace, cluster.prefills[0], len(pieces.head), cached
    finally:
        await cluster.close()


async def test_adaptive_warms_the_static_prefix_first_and_keeps_one_in_flight(
    smollm_tokenizer_path,  # noqa: F811
):
    ids, trace, worker, head, cached = await run_loop(
        smollm_tokenizer_path, ADAPTIVE, 0.001, prefill_s_per_token=0.0005
    )
    lengths = trace.warmup_lengths
    assert lengths[0] == head
    assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths)
    assert worker.max_concurrent == 1
    # Every warm-up extends the one before by tokens, so it finds all of it in the cache.
    assert len(lengths) >= 3
    assert cached[1:] == lengths[:-1]
    warm = worker.warmups()
    assert [len(w["input_ids"]) for w in warm] == lengths
    spans = trace.warmup_spans
    assert [s[2] for s in spans] == lengths and all(a <= b for a, b, _, _ in spans)
    assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(spans))  # one at a time
    assert all(w["bootstrap_host"] == "2.2.2.2" for w in warm)
    assert len(ids) > lengths[-1]


@pytest.mark.parametrize("chunk", [8, 32])
async def test_fixed_chunks_carry_exactly_chunk_tokens(smollm_tokenizer_path, chunk):  # noqa: F811
    policy = IncrementalPrefill(chunk_policy="fixed", chunk_tokens=chunk)
    ids, trace, _, head, cached = await run_loop(smollm_tokenizer_path, policy, 0.0)
    steps = [b - a for a, b in zip(trace.warmup_lengths, trace.warmup_lengths[1:])]
    assert trace.warmup_lengths[0] == head
    assert cached[1:] == trace.warmup_lengths[:-1]
    assert steps and all(s == chunk for s in steps)
    assert len(ids) - trace.warmup_lengths[-1] < chunk + 200  # only the tail remains


async def test_an_empty_static_prefix_is_not_warmed(smollm_tokenizer_path):  # noqa: F811
    # A template that starts with its slot (no system prompt, no chat template) has no head.
    pieces = PromptPieces(head=[], betweens=[[11], [12]], tail=[13], slots=["a", "b", "c"])
    ids, trace, worker, _, _ = await run_loop(
        smollm_tokenizer_path, ADAPTIVE, 0.001, pieces=pieces, verb="prefill_only"
    )
    assert trace.warmups >= 1 and all(n > 0 for n in trace.warmup_lengths)
    assert all(w[P.INPUT_IDS] for w in worker.warmups())
    assert ids[:40] == [1000 + t for t in range(40)]


@pytest.mark.parametrize("verb", ["generate", "prefill_only"])
async def test_a_warmup_that_times_out_is_aborted(smollm_tokenizer_path, verb):  # noqa: F811
    cluster = await start_fake_cluster(
        smollm_tokenizer_path,
        timeouts=Timeouts(warmup_s=0.2),
        warmup_verb=verb,
        prefill={"hang": True},
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            tok = ctx.tokenizer("smollm2")
            apc = AnswerCache(["a", "b", "c"])
            pieces = build_pieces(tok, AGG, "q?")
            prompt = SuccessorPrompt(
                "agg", pieces, {s: token_source(tok.eot_ids) for s in "abc"}, apc, set()
            )
            dep = ctx.deployments["smollm2"]
            trace = AgentTrace(model="smollm2", layer=2)
            loop = WarmupLoop(
                prompt, apc, dep, dep.pick_prefill(), ADAPTIVE, trace, Clock(), "moa-warm-t-", 5.0
            )
            with pytest.raises(
                WorkerError, match=r"warm-up request failed: no reply within 0.2s"
            ) as e:
                await asyncio.wait_for(loop.run(), 5)
        assert e.value.url.startswith(cluster.prefills[0].url)
        prefill = cluster.prefills[0]
        await asyncio.sleep(0.05)
        # The worker was told to drop the warm-up it was still holding.
        assert prefill.aborted == ["moa-warm-t-0"] and not prefill.active
    finally:
        await cluster.close()


async def test_adaptive_min_chunk_bounds_the_number_of_warmups(smollm_tokenizer_path):  # noqa: F811
    policy = IncrementalPrefill(min_chunk_tokens=30)
    _ids, trace, _, head, _ = await run_loop(smollm_tokenizer_path, policy, 0.001)
    lengths = trace.warmup_lengths
    assert lengths[0] == head
    assert all(b - a >= 30 for a, b in itertools.pairwise(lengths))
    # 120 precursor tokens: the static prefix plus at most four steps of >= 30.
    assert 2 <= len(lengths) <= 5


async def test_no_warmup_starts_while_a_critical_prefill_holds_the_gate(
    smollm_tokenizer_path,  # noqa: F811
):
    async with one_successor(smollm_tokenizer_path) as t:
        apc, dep, target, trace = t.apc, t.dep, t.target, t.trace
        loop = WarmupLoop(t.prompt, apc, dep, target, ADAPTIVE, trace, Clock(), "w-", 5.0)
        held = hold([dep.gate(target)])
        task = asyncio.create_task(loop.run())
        for i in range(20):
            apc.append("a", [1000 + i], [0.0], "")
            await asyncio.sleep(0.01)
        assert trace.warmups == 0 and not t.cluster.prefills[0].warmups()
        held.release()
        for _ in range(100):  # the gate opened: everything so far goes in one warm-up
            await asyncio.sleep(0.01)
            if trace.warmups:
                break
        assert trace.warmup_lengths == [len(t.pieces.head) + 20]
        # Held again while all precursors finish: the completed prompt supersedes the
        # warm-ups that waited, and none is sent.
        held = hold([dep.gate(target)])
        for agent in "abc":
            apc.append(agent, [7], [0.0], "")
            apc.finish(agent)
        ids = await asyncio.wait_for(task, 5)
        held.release()
        assert trace.warmups == 1 and len(ids) > trace.warmup_lengths[0]


async def test_the_loop_wakes_and_recomputes_its_prompt_only_when_its_own_precursors_change(
    smollm_tokenizer_path,  # noqa: F811
):
    """Under load a session's APC changes with every token of every agent: another agent's
    tokens must not make a successor rebuild its prompt, nor its own precursors' tokens while
    it waits at a closed gate (what a warm-up carries is read when the gate opens)."""
    async with one_successor(smollm_tokenizer_path, ("a", "b", "c", "other")) as t:
        apc, dep, target, trace, prompt = t.apc, t.dep, t.target, t.trace, t.prompt
        head = len(t.pieces.head)
        state = prompt.state
        builds = prompt.state = Mock(wraps=state)
        # Wake-ups: each one reads the precursors' progress.
        looks = prompt.progress = Mock(wraps=prompt.progress)
        loop = WarmupLoop(prompt, apc, dep, target, ADAPTIVE, trace, Clock(), "w-", 5.0)
        task = asyncio.create_task(loop.run())
        for _ in range(100):  # the static prefix goes first; then it waits for tokens
            await asyncio.sleep(0.01)
            if trace.warmups == 1:
                break
        await asyncio.sleep(0.02)
        before, looked_before = builds.call_count, looks.call_count
        for i in range(30):  # another agent's tokens: no rebuild, not even a wake-up
            apc.append("other", [5 + i], [0.0], "")
            await asyncio.sleep(0.002)
        assert builds.call_count == before and looks.call_count == looked_before
        held = hold([dep.gate(target)])
        apc.append("a", [1000], [0.0], "")  # its own token: one rebuild, then the gate
        await asyncio.sleep(0.02)
        queued = builds.call_count
        assert queued == before + 1 and trace.warmups == 1
        for i in range(1, 30):  # more of its own tokens while the gate is closed
            apc.append("a", [1000 + i], [0.0], "")
            await asyncio.sleep(0.002)
        assert builds.call_count == queued and trace.warmups == 1
        held.release()  # one warm-up with all 30 tokens
        for _ in range(100):
            await asyncio.sleep(0.01)
            if trace.warmups == 2:
                break
        assert trace.warmup_lengths == [head, head + 30]
        for agent in "abc":  # ending precursors complete the prompt
            apc.finish(agent)
        ids = await asyncio.wait_for(task, 5)
        assert ids[: head + 30] == state().ids[: head + 30]


async def test_a_closed_gate_does_not_time_out_while_precursors_progress(
    smollm_tokenizer_path,  # noqa: F811
):
    """The precursor timeout counts from the precursors' last progress, also at a closed gate;
    with no progress at all it fires."""
    async with one_successor(smollm_tokenizer_path) as t:
        apc, dep, target, trace = t.apc, t.dep, t.target, t.trace
        held = hold([dep.gate(target)])
        loop = WarmupLoop(t.prompt, apc, dep, target, ADAPTIVE, trace, Clock(), "w-", 0.2)
        task = asyncio.create_task(loop.run())
        for i in range(10):  # 0.5 s of progress, each step within the 0.2 s timeout
            apc.append("a", [1000 + i], [0.0], "")
            await asyncio.sleep(0.05)
        assert not task.done()
        with pytest.raises(TimeoutError, match=r"waited 0.2s for precursors"):
            await asyncio.wait_for(task, 2)
        held.release()
        assert trace.warmups == 0


async def feed_last_precursor(apc, c_tokens: int, delay_s: float) -> None:
    """a and b end at once; then c streams `c_tokens` tokens, `delay_s` apart, and ends."""
    for agent in "ab":
        apc.append(agent, [900], [0.0], "")
        apc.finish(agent)
    for t in range(c_tokens):
        await asyncio.sleep(delay_s)
        apc.append("c", [1000 + t], [0.0], "")
    apc.finish("c")


@pytest.mark.parametrize("timed", [True, False])
async def test_the_last_warmup_is_timed_to_the_last_precursors_cap(
    smollm_tokenizer_path,  # noqa: F811
    timed,
):
    """c, the last precursor, stops at its cap of 44 tokens. With min_chunk_tokens 32 the
    warm-ups leave up to 31 of its tokens to the final request (here 32 - a, b and the markup
    between them); timed to the cap (its rate × a warm-up's time, here ~1 token), one more
    goes as it nears the cap and leaves about that many."""
    async with one_successor(smollm_tokenizer_path, prefill_s_per_token=1e-4) as t:
        policy = IncrementalPrefill(min_chunk_tokens=32, warm_before_cap=timed)
        caps = {"a": 44, "b": 44, "c": 44}
        loop = WarmupLoop(
            t.prompt, t.apc, t.dep, t.target, policy, t.trace, Clock(), "w-", 5.0, caps=caps
        )
        run = asyncio.create_task(loop.run())
        await until(lambda: t.trace.warmups)  # the static prefix first
        assert t.trace.warmups == 1
        await feed_last_precursor(t.apc, 44, 0.03)
        ids = await asyncio.wait_for(run, 5)
        await loop.settle()
    c_left = len(ids) - len(t.pieces.tail) - t.trace.warmup_lengths[-1]
    if timed:
        assert 0 <= c_left <= 3, t.trace.warmup_lengths
    else:
        assert c_left >= 10, t.trace.warmup_lengths  # where min_chunk_tokens left it


async def test_the_prompt_goes_out_while_the_last_warmup_is_in_flight(
    smollm_tokenizer_path,  # noqa: F811
):
    """The last precursor ends while a warm-up is in the worker: `run` returns the complete
    prompt then, not when the warm-up replies; `settle` awaits the warm-up, whose record and
    gate slot are its own."""
    async with one_successor(smollm_tokenizer_path, prefill_s_per_token=0.04) as t:
        gate, clock = t.dep.gate(t.target), Clock()
        loop = WarmupLoop(t.prompt, t.apc, t.dep, t.target, ADAPTIVE, t.trace, clock, "w-", 5.0)
        run = asyncio.create_task(loop.run())
        # The static prefix (~27 tokens at 40 ms each) is in flight: every precursor ends.
        await until(lambda: gate.warmups_in_flight)
        assert t.trace.warmups == 0 and gate.warmups_in_flight == 1
        end_with_one_token(t.apc, "abc")
        ids = await asyncio.wait_for(run, 0.5)
        returned = clock.now()
        assert t.trace.warmups == 0  # it has not replied yet
        await loop.settle()
        assert t.trace.warmups == 1 and t.trace.warmup_spans[0][1] > returned
        assert gate.warmups_in_flight == 0
        assert ids[-len(t.pieces.tail) :] == list(t.pieces.tail)  # the whole prompt, tail too
        assert not t.cluster.prefills[0].aborted


async def test_without_final_beside_warmup_the_prompt_waits_for_the_warmup_in_flight(
    smollm_tokenizer_path,  # noqa: F811
):
    """`final_beside_warmup: false` (the ablation): the prompt completes while a warm-up is in
    the worker, and `run` returns it only once that warm-up replied."""
    async with one_successor(smollm_tokenizer_path, prefill_s_per_token=0.04) as t:
        gate, clock = t.dep.gate(t.target), Clock()
        policy = IncrementalPrefill(min_chunk_tokens=1, final_beside_warmup=False)
        loop = WarmupLoop(t.prompt, t.apc, t.dep, t.target, policy, t.trace, clock, "w-", 5.0)
        run = asyncio.create_task(loop.run())
        await until(lambda: gate.warmups_in_flight)
        end_with_one_token(t.apc, "abc")
        await asyncio.wait_for(run, 5)
        returned = clock.now()
        assert t.trace.warmups == 1 and t.trace.warmup_spans[0][1] <= returned
        await loop.settle()  # nothing left in flight
        assert t.trace.warmups == 1 and not t.cluster.prefills[0].aborted


async def test_a_cancelled_agent_aborts_the_warmup_still_in_flight(
    smollm_tokenizer_path,  # noqa: F811
):
    """`settle(abort=True)` (the agent was cancelled or its final request failed): the warm-up
    in flight when the prompt completed is aborted on the worker, its gate slot freed, and it
    is never counted as a warm-up."""
    async with one_successor(smollm_tokenizer_path, prefill_s_per_token=0.04) as t:
        gate = t.dep.gate(t.target)
        loop = WarmupLoop(t.prompt, t.apc, t.dep, t.target, ADAPTIVE, t.trace, Clock(), "w-", 5.0)
        run = asyncio.create_task(loop.run())
        await until(lambda: gate.warmups_in_flight)
        end_with_one_token(t.apc, "abc")
        await asyncio.wait_for(run, 0.5)
        await asyncio.wait_for(loop.settle(abort=True), 2)
        assert t.cluster.prefills[0].aborted == ["w-0"]
        assert t.trace.warmups == 0 and gate.warmups_in_flight == 0


async def test_a_warmup_that_no_longer_leads_the_prompt_is_aborted(
    smollm_tokenizer_path,  # noqa: F811
):
    """The prompt completes because the slot a warm-up in flight carried was dropped (early
    exit cut its agent): that warm-up's KV leads nowhere, so it is aborted, not left to run
    beside the final request."""
    async with one_successor(smollm_tokenizer_path, prefill_s_per_token=0.04) as t:
        gate = t.dep.gate(t.target)
        loop = WarmupLoop(t.prompt, t.apc, t.dep, t.target, ADAPTIVE, t.trace, Clock(), "w-", 5.0)
        end_with_one_token(t.apc, "bc")
        run = asyncio.create_task(loop.run())
        await until(lambda: t.trace.warmups, tries=300)  # the static prefix replies
        a_tokens = list(range(900, 940))
        t.apc.append("a", a_tokens, [0.0] * 40, "")
        await until(lambda: gate.warmups_in_flight)  # a warm-up with a's tokens goes
        assert t.trace.warmups == 1 and gate.warmups_in_flight == 1
        t.dropped.add("a")  # as Session.drop_slots does
        t.apc.touch()
        ids = await asyncio.wait_for(run, 0.5)
        await asyncio.wait_for(loop.settle(), 2)
        assert not any(ids[i : i + 40] == a_tokens for i in range(len(ids)))
        assert t.cluster.prefills[0].aborted == ["w-1"] and t.trace.warmups == 1
        assert gate.warmups_in_flight == 0
