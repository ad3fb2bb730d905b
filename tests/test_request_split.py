"""The replica choice (router/request_split.py), the shell router's and the simulator's: the least
open requests (the new one included) per unit of share, then the furthest below its share of what
was sent, then a seeded draw; in the shell router (router/pd.py) a successor's warm-ups and
final request on one prefill worker; and /metrics' per-replica load, labelled by model, role and
replica. Fake worker client; no process is started."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from urllib.parse import urlsplit

import pytest

from router.cluster import ModelDeployment, Timeouts
from router.metrics import RouterMetrics
from router.pd import Deployment
from router.request_split import ReplicaLoad, least_loaded

SHARES = [0.6, 0.3, 0.1]


def _spec(n_prefill: int = 3, **kw) -> ModelDeployment:
    return ModelDeployment(
        router_url="http://r",
        prefill_urls=[f"http://p{i}" for i in range(n_prefill)],
        bootstrap_ports=list(range(1, n_prefill + 1)),
        decode_urls=["http://d0", "http://d1"],
        tokenizer_path="t",
        **kw,
    )


class FakeClient:
    """Records each POST and what the metrics showed in flight at that moment."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics, self.posts = metrics, []

    async def post_json(self, url, body, stage, total_s):
        seen = _value(self.metrics, "in_flight", "prefill", _replica(url))
        self.posts.append((url, stage, seen))
        return {"meta_info": {"prompt_tokens": len(body["input_ids"]), "cached_tokens": 0}}

    async def stream(self, url, body, stage):
        self.posts.append((url, stage, _value(self.metrics, "in_flight", "decode", _replica(url))))
        yield {"text": "x"}


def _replica(url: str) -> str:
    """http://p1/generate -> "1"."""
    return urlsplit(url).hostname[-1]


def _value(metrics: RouterMetrics, kind: str, role: str, replica: str) -> float | None:
    name = {"in_flight": "moa_worker_requests_in_flight", "total": "moa_worker_requests_total"}
    labels = {"model": "m", "role": role, "replica": replica}
    return metrics.registry.get_sample_value(name[kind], labels)


def _deployment(
    seed: int, metrics: RouterMetrics | None = None, n_prefill: int = 3, **kw
) -> Deployment:
    metrics = metrics or RouterMetrics()
    spec, client = _spec(n_prefill, **kw), FakeClient(metrics)
    return Deployment(
        "m", spec, client, Timeouts(), "generate", random.Random(seed), metrics=metrics
    )


def _picks(dep: Deployment, n: int) -> list[int]:
    out = []
    for _ in range(n):
        target = dep.pick_prefill()
        out.append(target.index)
        dep.unpin(target)
    return out


def test_the_idle_replica_gets_the_next_request_under_skewed_load():
    # Shares equal: the least open requests wins, whatever was sent before.
    assert least_loaded([3, 0, 1], [1, 1, 1], [0, 9, 0]) == 1
    # Open requests, the new one included, per unit of share: twice the share, twice the load.
    # 2 ÷ ⅔ = 3 = 1 ÷ ⅓, a tie: then the one further below its share of what was sent.
    assert least_loaded([1, 0], [2 / 3, 1 / 3], [0, 0]) == 0
    assert least_loaded([2, 0], [2 / 3, 1 / 3], [0, 0]) == 1  # 3 ÷ ⅔ = 4.5 > 3
    assert least_loaded([0, 0, 0], SHARES, [0, 0, 0]) == 0  # idle: the largest share
    assert least_loaded([5, 2, 0], SHARES, [0, 0, 0]) == 0  # 10 = 10 = 10, then sent
    assert least_loaded([6, 3, 0], SHARES, [0, 0, 0]) == 2
    # Equal load: the replica furthest below its share of what was sent.
    assert least_loaded([0, 0], [0.5, 0.5], [4, 3]) == 1
    # Exact ties are drawn (never always the first: that would pin agents to replicas).
    picks = Counter(least_loaded([1, 1], [0.5, 0.5], [2, 2], random.Random(s)) for s in range(200))
    assert picks[0] > 50 and picks[1] > 50


@pytest.mark.parametrize("duration", [6, 30])
def test_shares_hold_in_the_long_run_under_load(duration):
    # One request a tick, each lasting `duration` ticks wherever it runs: the open requests stay
    # in proportion to the shares, and so do the requests sent.
    load = ReplicaLoad(2, [2 / 3, 1 / 3], random.Random(1))
    running = []
    for tick in range(3000):
        running = [(end, c) for end, c in running if end > tick or c.release()]
        running.append((tick + duration, load.choose()))
        assert sum(load.outstanding) == len(running) == min(tick + 1, duration)
    assert load.sent[0] / load.sent[1] == pytest.approx(2.0, rel=0.01)


def test_a_slower_replica_gets_fewer_requests():
    # Equal shares, but requests on replica 0 take three times as long: it is seen loaded.
    load = ReplicaLoad(2, [0.5, 0.5], random.Random(1))
    running = []
    for tick in range(3000):
        running = [(end, c) for end, c in running if end > tick or c.release()]
        c = load.choose()
        running.append((tick + (12 if c.index == 0 else 4), c))
    assert load.sent[0] / load.sent[1] == pytest.approx(1 / 3, rel=0.05)


def test_one_at_a_time_the_largest_share_takes_each_request_and_equal_shares_alternate():
    dep = _deployment(7, prefill_shares=SHARES, decode_shares=[0.5, 0.5])
    assert _picks(dep, 50) == [0] * 50
    even = _deployment(7, prefill_shares=[1 / 3] * 3)
    picks = _picks(even, 300)
    for n in range(0, 300, 3):
        assert sorted(picks[n : n + 3]) == [0, 1, 2]
    # The seed draws bootstrap rooms and exact ties only: the same seed, the same sequence; the
    # rounds of three not all in one order.
    assert _picks(_deployment(7, prefill_shares=[1 / 3] * 3), 300) == picks
    assert len({tuple(picks[n : n + 3]) for n in range(0, 300, 3)}) > 1


def test_a_busy_worker_is_passed_over():
    dep = _deployment(5, prefill_shares=[0.5, 0.25, 0.25], decode_shares=[0.5, 0.5])
    # Successors in flight: worker 0 takes two (its share is twice the others'), then one each.
    held = [dep.pick_prefill() for _ in range(4)]
    assert Counter(t.index for t in held) == {0: 2, 1: 1, 2: 1}
    # Worker 1's successor ends: the next goes there, though it was sent no fewer than worker 2.
    one = next(t for t in held if t.index == 1)
    dep.unpin(one)
    nxt = dep.pick_prefill()
    assert nxt.index == 1
    for t in held + [nxt]:
        if t is not one:
            dep.unpin(t)
    assert dep._load["prefill"].outstanding == [0, 0, 0]

    # Decode: a stream open on one worker sends the next request to the other.
    async def two_at_once() -> tuple[str, str]:
        a, b = dep.pick_prefill(), dep.pick_prefill()
        first = dep.dual({"input_ids": [1, 2], "rid": "a"}, a)
        it = first.stream.__aiter__()
        await it.__anext__()  # streaming: open on its decode worker
        second = dep.dual({"input_ids": [1, 2], "rid": "b"}, b)
        urls = first.abort_urls[1], second.abort_urls[1]
        async for _ in second.stream:
            pass
        await it.aclose()
        dep.unpin(a)
        dep.unpin(b)
        return urls

    for _ in range(20):
        first, second = asyncio.run(two_at_once())
        assert first != second
    assert dep._load["decode"].outstanding == [0, 0]
    assert dep._load["prefill"].outstanding == [0, 0, 0]


def test_every_agent_uses_every_replica_over_many_questions():
    """A question's agents choose in the same order each time (three leaves, then their
    successor once they ended): over 100 questions each one ran on every prefill and every
    decode worker."""
    dep = _deployment(11, n_prefill=2, prefill_shares=[0.5, 0.5], decode_shares=[0.5, 0.5])
    used: dict[str, set] = {}

    async def agent(name: str, wait: list[asyncio.Task]) -> None:
        await asyncio.gather(*wait)
        target = dep.pick_prefill()
        call = dep.dual({"input_ids": [1, 2, 3], "rid": name}, target)
        used.setdefault(name, set()).add((target.index, call.abort_urls[1]))
        async for _ in call.stream:
            await asyncio.sleep(0)
        dep.unpin(target)

    async def question() -> None:
        leaves = [asyncio.create_task(agent(a, [])) for a in ("l0", "l1", "l2")]
        await agent("s", leaves)

    async def run_all() -> None:
        for _ in range(100):
            await question()

    asyncio.run(run_all())
    for name, pairs in used.items():
        assert {p for p, _ in pairs} == {0, 1}, name
        assert {d for _, d in pairs} == {"http://d0", "http://d1"}, name


def test_without_a_split_the_least_pinned_worker_is_chosen():
    dep = _deployment(7)
    held = [dep.pick_prefill() for _ in range(6)]
    assert Counter(t.index for t in held) == {0: 2, 1: 2, 2: 2}


def test_decode_workers_by_share_and_a_successor_stays_on_its_prefill_worker():
    metrics = RouterMetrics()
    dep = _deployment(3, metrics, prefill_shares=SHARES, decode_shares=[0.5, 0.5])

    async def successor() -> None:
        target = dep.pick_prefill()
        await dep.warmup(target, [1, 2, 3], "w1")
        await dep.warmup(target, [1, 2, 3, 4], "w2")
        async for _ in dep.dual({"input_ids": [1, 2, 3, 4, 5], "rid": "f"}, target).stream:
            pass
        dep.unpin(target)

    async def run_all() -> None:
        for _ in range(300):
            await successor()

    asyncio.run(run_all())
    posts = dep._client.posts
    prefill_urls = [u for u, stage, _ in posts if stage in ("warm-up", "prefill")]
    # Each successor: two warm-ups and its final request's prefill, all on one worker.
    for i in range(0, len(prefill_urls), 3):
        assert len(set(prefill_urls[i : i + 3])) == 1, prefill_urls[i : i + 3]
    decodes = Counter(u for u, stage, _ in posts if stage == "decode")
    # One at a time on equal shares: they alternate.
    assert decodes == {"http://d0/generate": 150, "http://d1/generate": 150}, decodes
    # In flight while it is sent (1: the request itself), none once done; totals per replica.
    assert {seen for _, _, seen in posts} == {1.0}
    for r in range(3):
        assert _value(metrics, "in_flight", "prefill", str(r)) in (None, 0.0)
    total = sum(_value(metrics, "total", "prefill", str(r)) or 0 for r in range(3))
    assert total == 900
    assert _value(metrics, "total", "decode", "0") == decodes["http://d0/generate"]
    text = metrics.render().decode()
    assert 'moa_worker_requests_total{model="m",replica="1",role="decode"}' in text


def test_a_bad_split_in_the_cluster_file_is_refused():
    with pytest.raises(ValueError, match="2 prefill_shares for 3 workers"):
        _spec(prefill_shares=[0.5, 0.5])
    with pytest.raises(ValueError, match="sum to 1"):
        _spec(decode_shares=[0.5, 0.6])
