"""Where a leaf's first token waits at a question's start (issue 28, item 3): N streaming
requests at once, as a question's leaves start, on one model of a running deployment, by two
paths in alternate rounds: `router`, through the model's native sglang-router; `dual`, sent to a
prefill and a decode worker by the shell router's own code (router/pd.py `Deployment.dual`, how
the shell router sends every agent's request). For each request: when its decode worker sent the
first chunk (its `response_sent_to_client_ts`) and when that chunk arrived here.

    moa-pd up --config tree_9_3_1_cpu --run-dir /tmp/dep9 --detach
    python -m benchmarks.first_chunk_hold --cluster /tmp/dep9/cluster.json --requests 9

The hold through the native router is the sglang-router's: its PD dispatch
(`execute_dual_dispatch`) awaits the prefill worker's response headers together with decode's
(`tokio::join!` of both sends) before it streams decode to the client, and a prefill worker
answers a finished request only when its scheduler next polls the KV transfers, after the
forward batch under way. `dual` streams decode's chunks as they come.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from pathlib import Path

import aiohttp

from router.cluster import load_cluster
from router.pd import Deployment
from sglang_ext import protocol as P

PATHS = ("router", "dual")
# ~150 tokens: long enough that nine of them take the prefill worker several forward chunks.
PROMPT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May? Think step by "
    "step. "
) * 3


async def first_chunk(dep: Deployment, path: str, ids: list[int], i: int, t0: float) -> dict:
    """The request's first-chunk times, in seconds since t0 (all requests of a round share it)."""
    body = {
        P.INPUT_IDS: ids,
        P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: 16, P.TEMPERATURE: 0.0},
        P.RID: f"hold-{uuid.uuid4().hex}",
    }
    row: dict = {"request": i}
    with contextlib.ExitStack() as stack:
        if path == "dual":
            call = dep.dual(body, stack.enter_context(dep.pinned()))
        else:
            call = dep.via_router(body)
        async for chunk in call.stream:
            if "received_s" not in row and chunk.get(P.OUTPUT_IDS):
                row["received_s"] = time.time() - t0
                sent = chunk.get(P.META_INFO, {}).get(P.RESPONSE_SENT_TO_CLIENT_TS)
                row["sent_s"] = None if sent is None else sent - t0
    return row


async def measure(cluster_path: Path, model: str | None, n: int, rounds: int) -> list[dict]:
    """`rounds` rounds of each path, alternating (router first in odd pairs, dual in even)."""
    from router.context import RouterContext
    from sglang_ext.hf_tokenizer import load_tokenizer

    cluster = load_cluster(cluster_path)
    name = model or next(iter(cluster.models))
    tok = load_tokenizer(cluster.models[name].tokenizer_path)
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        dep = RouterContext(cluster, session).deployments[name]
        for k in range(rounds):
            order = PATHS if k % 2 == 0 else PATHS[::-1]
            for path in order:
                # A prefix of its own per request: no cache hit.
                prompts = [
                    tok.encode(f"({path}, round {k + 1}, request {i}, {time.time()}) {PROMPT}")
                    for i in range(n)
                ]
                t0 = time.time()
                rows = await asyncio.gather(
                    *(first_chunk(dep, path, ids, i, t0) for i, ids in enumerate(prompts))
                )
                results.append({"round": k + 1, "path": path, "model": name, "rows": rows})
    return results


def report(results: list[dict]) -> None:
    holds_by_path: dict[str, list[float]] = {p: [] for p in PATHS}
    for res in results:
        rows = res["rows"]
        holds = [r["received_s"] - r["sent_s"] for r in rows if r.get("sent_s") is not None]
        holds_by_path[res["path"]] += holds
        print(f"round {res['round']}, {res['model']} via {res['path']}:")
        for r in sorted(rows, key=lambda r: r["received_s"]):
            hold = "-" if r.get("sent_s") is None else f"{r['received_s'] - r['sent_s']:.2f}"
            sent = "-" if r.get("sent_s") is None else f"{r['sent_s']:.2f}"
            print(f"  request {r['request']}: sent {sent} s, received {r['received_s']:.2f} s, "
                  f"held {hold} s")  # fmt: skip
        if holds:
            print(f"  held: median {statistics.median(holds):.2f} s, max {max(holds):.2f} s")
    print("all rounds:")
    for path, holds in holds_by_path.items():
        if holds:
            print(f"  {path}: {len(holds)} requests, held median "
                  f"{statistics.median(holds):.3f} s, max {max(holds):.3f} s")  # fmt: skip
        else:
            print(f"  {path}: no request reported response_sent_to_client_ts")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.first_chunk_hold",
        description="N streaming requests at once on one model, through its native "
        "sglang-router and as the shell router sends them, in alternate rounds: decode's "
        "first chunk sent vs received here",
    )
    ap.add_argument("--cluster", type=Path, required=True, help="cluster.json of a deployment")
    ap.add_argument("--model", help="the model's name in cluster.json (default: the first)")
    ap.add_argument("--requests", type=int, default=9, help="requests at once (a 9-3-1 layer)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each path")
    args = ap.parse_args(argv)
    report(asyncio.run(measure(args.cluster, args.model, args.requests, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
