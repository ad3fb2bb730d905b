"""A plan's request split in the shell router (router/pd.py): successors' prefill workers and
every request's decode worker by share (smooth weighted round robin, as the simulator), a successor's
warm-ups and final request on one prefill worker; and /metrics' per-replica load, labelled by
model, role and replica. Fake worker client; no process is started."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from urllib.parse import urlsplit

import pytest

from router.cluster import ModelDeployment, Timeouts
from router.metrics import RouterMetrics
from router.pd import Deployment

SHARES = [0.6, 0.3, 0.1]


def _spec(**kw) -> ModelDeployment:
    return ModelDeployment(
        router_url="http://r",
        prefill_urls=[f"http://p{i}" for i in range(3)],
        bootstrap_ports=[1, 2, 3],
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


def _deployment(seed: int, metrics: RouterMetrics | None = None, **kw) -> Deployment:
    metrics = metrics or RouterMetrics()
    return Deployment(
        "m", _spec(**kw), FakeClient(metrics), Timeouts(), "generate", random.Random(seed),
        metrics=metrics,
    )  # fmt: skip


def _picks(dep: Deployment, n: int) -> list[int]:
    out = []
    for _ in range(n):
        target = dep.pick_prefill()
        out.append(target.index)
        dep.unpin(target)
    return out


def test_prefill_workers_follow_their_shares_smoothly_and_deterministically():
    dep = _deployment(7, prefill_shares=SHARES, decode_shares=[0.5, 0.5])
    picks = _picks(dep, 4000)
    # Every prefix of the sequence is within one request of its shares: no bursts.
    for n in (10, 100, 4000):
        counts = Counter(picks[:n])
        for i, share in enumerate(SHARES):
            assert abs(counts[i] - share * n) <= 1, (n, counts)
    assert picks[:10] == [0, 0, 1, 0, 0, 1, 0, 0, 1, 2]  # 6, 3, 1 of every ten
    # The seed draws bootstrap rooms, never the split.
    assert _picks(_deployment(8, prefill_shares=SHARES), 200) == picks[:200]
    assert dep.planned_split


def test_without_a_split_the_least_pinned_worker_is_chosen():
    dep = _deployment(7)
    held = [dep.pick_prefill() for _ in range(6)]
    assert Counter(t.index for t in held) == {0: 2, 1: 2, 2: 2} and not dep.planned_split


def test_decode_workers_by_share_and_a_successor_stays_on_its_prefill_worker():
    metrics = RouterMetrics()
    dep = _deployment(3, metrics, prefill_shares=SHARES, decode_shares=[0.8, 0.2])

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
    assert decodes == {"http://d0/generate": 240, "http://d1/generate": 60}, decodes
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
