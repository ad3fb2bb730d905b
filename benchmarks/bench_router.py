"""Shell-router micro-benchmark (issue 4): 3 precursors x N output tokens into one aggregator
(~200 tokens of template, M output tokens) on a running PD deployment, all variants interleaved
in one run, medians over repetitions.

  (a) cached_tokens / prompt_tokens of the aggregator's final request (prefill worker's figure)
  (b) last precursor token -> aggregator last token, pipelined / blocking; and the share of
      blocking's exposed aggregator prefill that pipelining hid
  (c) shell-router overhead per request vs calling sglang-router directly (paired, interleaved)
  (d) adaptive vs fixed 8/32/128-token chunks on (b)

Usage: moa-pd up cfgs/tree_3_1_cpu.json --backend torch   (writes runs/.../cluster.json)
       python -m benchmarks.bench_router --cluster runs/.../cluster.json [--reps 3]
`--stagger S` starts precursor i S*i seconds late, as slower models would finish later.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import aiohttp

from router.api_key import auth_headers, client_key
from router.cluster import load_cluster
from router.config import TopologyConfig
from router.context import RouterContext
from router.orchestrator import Session
from sglang_ext import protocol as P

FILLER = (
    "Read every candidate in full. Check each arithmetic step and each claim against the "
    "question. Prefer the candidate whose reasoning is complete and whose final answer "
    "follows from it; when candidates disagree, recompute the disputed step yourself. "
)


def topology(model: str, n_pre: int, agg_tokens: int, variant: str) -> TopologyConfig:
    slots = "".join(f"\n\n[Candidate {i + 1}]\n<|answer:p{i}|>" for i in range(n_pre))
    # Variants: "blocking", "adaptive", "fixed_N" (N-token warm-up chunks).
    chunk = (
        ("fixed", int(variant.split("_")[1])) if variant.startswith("fixed_") else ("adaptive", 32)
    )
    return TopologyConfig.model_validate(
        {
            "name": f"bench_{variant}",
            "models": {model: {"model_path": model}},
            "templates": {
                "pre": {"system": "You are a careful solver.", "user": "{question}"},
                "agg": {
                    "system": "You judge candidate answers. " + FILLER * 3,
                    "user": "Question:\n{question}" + slots + "\n\nWrite the best answer.",
                },
            },
            "agents": [{"id": f"p{i}", "model": model, "template": "pre"} for i in range(n_pre)]
            + [
                {
                    "id": "agg",
                    "model": model,
                    "template": "agg",
                    "sampling": {"max_new_tokens": agg_tokens},
                }
            ],
            "sampling": {"temperature": 0.0, "ignore_eos": True},
            "incremental_prefill": {"chunk_policy": chunk[0], "chunk_tokens": chunk[1]},
        }
    )


async def one_question(ctx, cfg, question, mode, pre_tokens, stagger_s) -> dict:
    cfg = cfg.model_copy(
        update={
            "agents": [
                a.model_copy(
                    update={
                        "sampling": a.sampling.model_copy(update={"max_new_tokens": pre_tokens})
                    }
                )
                if a.id != "agg"
                else a
                for a in cfg.agents
            ]
        }
    )
    s = Session(ctx, cfg, question, mode)
    try:
        s.start_agent("agg")
        for i, a in enumerate(x.id for x in cfg.agents if x.id != "agg"):
            if stagger_s and i:
                await asyncio.sleep(stagger_s)
            s.start_agent(a)
        await asyncio.wait(s.tasks.values())
    finally:
        await s.close()
        s.release()
    tr = s.trace()
    if tr["agg"]["error"]:
        raise RuntimeError(tr["agg"]["error"])
    last_pre = max(t["end_s"] for a, t in tr.items() if a != "agg")
    agg = tr["agg"]
    return {
        "cached_ratio": agg["cached_tokens"] / agg["prompt_tokens"],
        "prompt_tokens": agg["prompt_tokens"],
        "cached_tokens": agg["cached_tokens"],
        "tail_s": agg["end_s"] - last_pre,
        "exposed_s": agg["first_token_s"] - last_pre,
        "warmups": agg["warmups"],
    }


async def overhead_pairs(
    ctx, shell_url: str, model: str, n: int, api_key: str | None = None
) -> list[float]:
    """Paired (shell router - direct sglang-router) latency of one 1-token request."""
    dep = ctx.deployments[model]
    tok = ctx.tokenizer(model)
    single = {
        "name": "bench_single",
        "models": {model: {"model_path": model}},
        "templates": {"t": {"user": "{question}"}},
        "agents": [{"id": "a", "model": model, "template": "t"}],
        "sampling": {"max_new_tokens": 1, "temperature": 0.0},
    }
    diffs = []
    async with aiohttp.ClientSession(headers=auth_headers(api_key)) as http:
        # Registered once, as a served config is: the router parses it once, not per request.
        async with http.post(f"{shell_url}/v1/moa/configs", json=single) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"registering {single['name']}: {r.status} {await r.text()}")

        async def direct(q: str) -> float:
            ids = tok.encode(
                tok.tok.apply_chat_template(
                    [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
                )
            )
            t0 = time.perf_counter()
            async with http.post(
                f"{dep.spec.router_url}/generate",
                json={P.INPUT_IDS: ids, P.SAMPLING_PARAMS: {"max_new_tokens": 1, "temperature": 0}},
            ) as r:
                await r.read()
            return time.perf_counter() - t0

        async def shell(q: str) -> float:
            t0 = time.perf_counter()
            async with http.post(
                f"{shell_url}/v1/moa/agent",
                json={
                    "session_id": uuid.uuid4().hex,
                    "config": single["name"],
                    "question": q,
                    "agent": "a",
                    "stream": False,
                },
            ) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"shell router answered {r.status}: {body}")
            return time.perf_counter() - t0

        for i in range(n):
            q = f"Say one word. ({i})"
            await direct(q)  # warm the prefix, so neither timed call pays the prefill
            # Alternate which goes first, so neither gains from running second.
            if i % 2:
                d, s = await direct(q), await shell(q)
            else:
                s, d = await shell(q), await direct(q)
            diffs.append(s - d)
    return diffs


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


async def main_async(args) -> dict:
    cluster = load_cluster(args.cluster)
    model = args.model or next(iter(cluster.models))
    variants = ["blocking", "adaptive"] + [f"fixed_{c}" for c in args.chunks]
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    async with RouterContext.open(cluster) as ctx:
        ctx.tokenizer(model)
        for rep in range(args.reps):
            for v in variants:  # interleaved: A B C ... A B C ...
                cfg = topology(model, 3, args.agg_tokens, v)
                q = f"[run {uuid.uuid4().hex[:8]}] {args.question}"
                mode = "blocking" if v == "blocking" else "pipelined"
                row = await one_question(ctx, cfg, q, mode, args.pre_tokens, args.stagger)
                rows[v].append(row)
                print(json.dumps({"rep": rep, "variant": v, **row}), file=sys.stderr, flush=True)
        shell = args.shell_url or cluster.shell_router_url
        key = client_key(json.loads(Path(args.cluster).read_text()), args.cluster)
        diffs = await overhead_pairs(ctx, shell, model, args.overhead_n, key) if shell else []
    b = rows["blocking"]
    out = {"setup": vars(args), "medians": {}}
    for v, rs in rows.items() if args.reps else ():
        out["medians"][v] = {
            k: med(rs, k)
            for k in ("cached_ratio", "tail_s", "exposed_s", "warmups", "prompt_tokens")
        }
    for v in variants[1:] if args.reps else ():
        m = out["medians"][v]
        m["tail_ratio_vs_blocking"] = m["tail_s"] / med(b, "tail_s")
        # Exposed = last precursor token -> aggregator first token. Blocking's includes its
        # whole uncached prefill; what pipelining removed of it is the hidden share.
        m["hidden_share_of_exposed"] = 1 - m["exposed_s"] / med(b, "exposed_s")
    if diffs:
        out["overhead_ms"] = {"median": 1000 * statistics.median(diffs), "n": len(diffs)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--shell-url", default=None, help="shell router for (c); default: cluster's")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pre-tokens", type=int, default=256)
    ap.add_argument("--agg-tokens", type=int, default=64)
    ap.add_argument("--chunks", type=int, nargs="*", default=[8, 32, 128])
    ap.add_argument("--stagger", type=float, default=0.0)
    ap.add_argument("--overhead-n", type=int, default=30)
    ap.add_argument(
        "--question",
        default="A train travels 120 km in 1.5 hours. What is its "
        "average speed in km/h? Explain briefly.",
    )
    ap.add_argument("--out", default=None, help="write the summary JSON here too")
    args = ap.parse_args(argv)
    out = asyncio.run(main_async(args))
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
