"""Where a leaf's first token waits at a question's start (issue 28, item 3): N streaming
/generate requests at once, as a question's leaves start, sent straight to one model's native
sglang-router (no shell router in the way). For each request: when its decode worker sent the
first chunk (its `response_sent_to_client_ts`) and when that chunk arrived here.

    moa-pd up --config tree_9_3_1_cpu --run-dir /tmp/dep9 --detach
    python -m benchmarks.first_chunk_hold --cluster /tmp/dep9/cluster.json --requests 9

A hold here is the sglang-router's: its PD dispatch (`execute_dual_dispatch`) awaits the prefill
worker's response headers together with decode's (`tokio::join!` of both sends) before it
streams decode to the client, and a prefill worker answers a finished request only when its
scheduler next polls the KV transfers, after the forward batch under way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import aiohttp

from sglang_ext import protocol as P

# ~150 tokens: long enough that nine of them take the prefill worker several forward chunks.
PROMPT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May? Think step by "
    "step. "
) * 3


async def first_chunk(
    session: aiohttp.ClientSession, url: str, tag: str, i: int, t0: float
) -> dict:
    """The request's first-chunk times, in seconds since t0 (all requests share it)."""
    body = {
        P.TEXT: f"({tag}, request {i}) {PROMPT}",  # a prefix of its own: no cache hit
        P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: 16, P.TEMPERATURE: 0},
        P.STREAM: True,
    }
    async with session.post(url + "/generate", json=body) as r:
        r.raise_for_status()
        row: dict = {"request": i}
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            if "received_s" not in row:
                row["received_s"] = time.time() - t0
                sent = json.loads(line[5:])[P.META_INFO].get(P.RESPONSE_SENT_TO_CLIENT_TS)
                row["sent_s"] = None if sent is None else sent - t0
        return row


async def probe(url: str, n: int, tag: str) -> list[dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        t0 = time.time()
        asks = (first_chunk(session, url, tag, i, t0) for i in range(n))
        return list(await asyncio.gather(*asks))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.first_chunk_hold",
        description="N streaming requests at once through one model's sglang-router: decode's "
        "first chunk sent vs received here",
    )
    ap.add_argument("--cluster", type=Path, required=True, help="cluster.json of a deployment")
    ap.add_argument("--model", help="the model's name in cluster.json (default: the first)")
    ap.add_argument("--requests", type=int, default=9, help="requests at once (a 9-3-1 layer)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each with prompts of its own")
    args = ap.parse_args(argv)
    models = json.loads(args.cluster.read_text())["models"]
    name = args.model or next(iter(models))
    url = models[name]["router_url"]
    for k in range(args.rounds):
        rows = asyncio.run(probe(url, args.requests, f"round {k + 1} at {time.time():.0f}"))
        holds = [r["received_s"] - r["sent_s"] for r in rows if r.get("sent_s") is not None]
        print(f"round {k + 1}, {name} via {url}:")
        for r in sorted(rows, key=lambda r: r["received_s"]):
            hold = "-" if r.get("sent_s") is None else f"{r['received_s'] - r['sent_s']:.2f}"
            sent = "-" if r.get("sent_s") is None else f"{r['sent_s']:.2f}"
            print(f"  request {r['request']}: sent {sent} s, received {r['received_s']:.2f} s, "
                  f"held {hold} s")  # fmt: skip
        if holds:
            print(f"  held: median {statistics.median(holds):.2f} s, max {max(holds):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
