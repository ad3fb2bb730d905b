"""The loop the router-behaviour benchmarks share (bench_priority, bench_warmup_cost,
bench_start_order, bench_warmup_timing): questions in blocks, each block through every variant's shell router in turn
(the order rotating per block, so no variant always runs first or last), on cold caches, N in
flight; one row per question and variant, appended to a JSONL file as each block ends, so a run
stopped midway keeps what it measured."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.bench_overlap import log
from experiments.critical_path import breakdown, exposed_detail
from experiments.datasets import Question
from experiments.paired_stats import median_ci
from experiments.prompts import build_question_prompt
from experiments.results import ResultRow
from experiments.router_client import RouterClient
from experiments.router_load import window, window_values
from experiments.run import flush_worker_caches


@dataclass(frozen=True)
class Variant:
    """A shell router's behaviour: the mode its questions run in, its cluster-file overrides
    (benchmarks/shell_routers.py starts one router per variant) and the top-level keys its
    copy of the topology config changes (none: the benchmark's config as it is)."""

    mode: str = "pipelined"
    overrides: dict = field(default_factory=dict)
    config_edits: dict = field(default_factory=dict)


# Before and after each block, a variant's router is read (its /metrics, say): `measure(url)`;
# `fields(before, after, questions)` turns the two readings into the block's row fields.
Measure = Callable[[str], Awaitable[dict]]
Fields = Callable[[dict, dict, int], dict]


async def run_block(
    url: str,
    cfg_name: str,
    questions: list[Question],
    n: int,
    arrivals: list[float],
    mode: str = "pipelined",
) -> list[dict]:
    """The block's questions in router `mode`, each arriving at its time in `arrivals` (seconds
    from the block's start), `n` in flight at most; one row per question (`position`: its
    place in the block, by which it started; `critical_path`: the seconds of each part of its
    critical path, experiments/critical_path.py; `warmups`: the warm-ups its successors sent)."""
    sem = asyncio.Semaphore(n)
    async with RouterClient(url) as client:
        t0 = time.perf_counter()

        async def one(position: int, q: Question, at: float) -> dict:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            async with sem:
                start = time.perf_counter()
                result = await client.run_graph(
                    build_question_prompt(q), q.id, cfg_name, mode, False
                )
                end = time.perf_counter()
            trace = result["trace"]
            return {
                "id": q.id,
                "position": position,
                "start_s": start - t0,
                "arrival_s": at,
                "in_flight_s": end - start,
                "from_arrival_s": end - (t0 + at),
                "critical_path": critical_path_parts(trace, end - start),
                "exposed_detail": exposed_detail(trace_row(trace, end - start)),
                "warmups": sum(a.get("warmups", 0) for a in trace.values()),
                "outputs": outputs_digest(trace),
            }

        rows = await asyncio.gather(
            *(one(i, q, at) for i, (q, at) in enumerate(zip(questions, arrivals)))
        )
        wall = time.perf_counter() - t0
    return [{**r, "block_wall_s": wall} for r in rows]


def outputs_digest(trace: dict[str, dict]) -> str:
    """A digest of every agent's output tokens: two runs of a question are token-identical,
    agent for agent, when theirs are equal."""
    outputs = {agent: a.get("output_ids", []) for agent, a in sorted(trace.items())}
    return hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:16]


def trace_row(trace: dict[str, dict], e2e_s: float) -> ResultRow:
    """A results row around a question the router answered with `trace` (its agents' records)
    in `e2e_s`, for the critical-path functions (they read the trace alone: any MoA setting)."""
    return ResultRow.model_validate(
        {"sample_id": "-", "dataset": "-", "setting": 3, "e2e_s": e2e_s, "agents": trace}
    )


def critical_path_parts(trace: dict[str, dict], e2e_s: float) -> dict[str, float] | None:
    """Seconds of each part of the critical path of a question the router answered with
    `trace` in `e2e_s`."""
    return breakdown(trace_row(trace, e2e_s))


def latency_stats(rows: list[dict], key: str) -> str:
    """Mean / median / p90 of `key` over `rows`, in seconds."""
    xs = [r[key] for r in rows]
    return f"{statistics.mean(xs):.1f} / {statistics.median(xs):.1f} / {np.percentile(xs, 90):.1f}"


async def router_metrics(url: str) -> dict:
    """The shell router's warm-ups sent (all models) and each device's measured slowdown, from
    its /metrics; and its load counters (`stats`: `GET /v1/moa/stats`, None where it has none)."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict = {"warmups": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "moa_warmups_total":
                out["warmups"] += sample.value
            elif sample.name == "moa_device_warmup_decode_slowdown":
                out[f"slowdown.{sample.labels['device']}"] = sample.value
            elif sample.name == "moa_device_warmup_decode_slowdown_weighed":
                out[f"slowdown_weighed.{sample.labels['device']}"] = sample.value
    async with RouterClient(url) as client:
        out["stats"] = await client.stats()
    return out


def warmup_fields(before: dict, after: dict, questions: int) -> dict:
    """A block's warm-ups per question, the slowdown each device measured at its end, and the
    router's CPU seconds per question and event-loop lag p99 over the block (where it has
    /v1/moa/stats). The block's window is the router's alone (`alone=True`): one variant runs
    on it at a time, so all it did meanwhile is this block's questions."""
    warmups = (after["warmups"] - before["warmups"]) / questions
    out = {
        "warmups_per_q": warmups,
        **{k: v for k, v in after.items() if k.startswith(("slowdown.", "slowdown_weighed."))},
    }
    load = window_values(window(before.get("stats"), after.get("stats"), alone=True))
    if load["router_cpu_s"] is not None:
        out["router_cpu_s_per_q"] = load["router_cpu_s"] / questions
    if load["router_lag_p99_s"] is not None:
        out["router_lag_p99_s"] = load["router_lag_p99_s"]
    return out


def by_device(row: dict, prefix: str) -> str:
    """`row`'s per-device fields under `prefix` (warmup_fields' "slowdown."), as "cpu 0.012"."""
    return ", ".join(
        f"{k.removeprefix(prefix)} {v:.3f}" for k, v in row.items() if k.startswith(prefix)
    )


def rotated(names: Sequence[str], block: int) -> list[str]:
    """The variants' order in `block`: each block starts one later than the one before."""
    k = block % len(names)
    return [*names[k:], *names[:k]]


async def run_variants(
    cluster: dict,
    urls: dict[str, str],
    variants: dict[str, Variant],
    cfg_name: str | dict[str, str],
    questions: list[Question],
    concurrency: Sequence[int],
    block: int,
    out_file: Path,
    arrivals: Callable[[int, int], list[float]] = lambda b, count: [0.0] * count,
    measure: Measure | None = None,
    fields: Fields | None = None,
    tags: dict | None = None,
) -> list[dict]:
    """Every block of `block` questions through every variant at each concurrency; the rows
    (`run_block`'s, with concurrency, block, variant and `tags` added). `cfg_name`: the served
    topology the questions name, or one per variant (shell_routers.Routers.config_names).
    `arrivals(block, count)`: seconds from the block's start at which its questions arrive."""
    rows: list[dict] = []
    with out_file.open("w") as f:
        for n in concurrency:
            blocks = [questions[i : i + block] for i in range(0, len(questions), block)]
            for b, qs in enumerate(blocks):
                for name in rotated(list(variants), b):
                    url = urls[name]
                    async with RouterClient(url) as client:
                        await flush_worker_caches(client, cluster)
                    before = await measure(url) if measure else {}
                    block_rows = await run_block(
                        url,
                        cfg_name if isinstance(cfg_name, str) else cfg_name[name],
                        qs,
                        n,
                        arrivals(b, len(qs)),
                        variants[name].mode,
                    )
                    extra = (
                        fields(before, await measure(url), len(qs)) if measure and fields else {}
                    )
                    for r in block_rows:
                        r.update(concurrency=n, block=b, variant=name, **(tags or {}), **extra)
                        rows.append(r)
                        f.write(json.dumps(r) + "\n")
                    f.flush()
                    said = ", ".join(
                        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in extra.items()
                    )
                    log(
                        f"c{n} block {b} {name:12s}: {len(qs)} questions in "
                        f"{block_rows[0]['block_wall_s']:.1f}s" + (f", {said}" if said else "")
                    )
    return rows


def paired(rows: list[dict], variant: str, reference: str) -> list[tuple[dict, dict]]:
    """(variant's row, reference's row) for each question both ran in the same block."""
    by = {(r["variant"], r["block"], r["id"]): r for r in rows}
    return [
        (r, by[(reference, b, i)])
        for (v, b, i), r in by.items()
        if v == variant and (reference, b, i) in by
    ]


def throughput(rows: list[dict]) -> float:
    """Questions per second of block wall time, over the blocks `rows` ran in."""
    walls = {r["block"]: r["block_wall_s"] for r in rows}
    return len(rows) / sum(walls.values())


def ratio_lines(
    rows: list[dict], n: int, variant: str, reference: str, label: str | None = None
) -> list[str]:
    """Table rows `| N | label | questions | n | median [95% CI] | best | worst |` (`label`: the
    variant's name by default) of the variant's in-flight latency ÷ the reference's, per
    question: over all questions, and at
    N > 1 over those that started last in their block (position ≥ N: they start as the first
    ones end, the ones that lost under load before)."""
    pairs = paired(rows, variant, reference)
    subsets = {"all": pairs}
    if n > 1:
        subsets["started last"] = [(r, ref) for r, ref in pairs if r["position"] >= n]
    out = []
    for subset, chosen in subsets.items():
        if not chosen:
            continue
        ratios = [r["in_flight_s"] / ref["in_flight_s"] for r, ref in chosen]
        med, lo, hi = median_ci(ratios)
        out.append(
            f"| {n} | {label or variant} | {subset} | {len(ratios)} | {med:.3f} [{lo:.3f}, {hi:.3f}] "
            f"| {min(ratios):.3f} | {max(ratios):.3f} |"
        )
    return out


def block_arguments(description: str, concurrency: list[int], block: int, out: str):
    """The command line these benchmarks share: --config, --dataset, --num-samples, --offset,
    --concurrency (comma-separated), --block, --out, with the given defaults; each adds its
    own, then calls `check_block_arguments`."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default="tree_9_3_1_cpu")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--num-samples", type=int, default=16, help="questions per concurrency")
    ap.add_argument("--offset", type=int, default=0, help="skip the dataset's first N questions")
    shown = ",".join(map(str, concurrency))
    ap.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=concurrency,
        help=f"questions in flight, comma-separated (default {shown})",
    )
    ap.add_argument("--block", type=int, default=block, help="questions per block")
    ap.add_argument("--out", default=out)
    return ap


def check_block_arguments(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.num_samples < 1 or args.block < 1 or min(args.concurrency) < 1:
        ap.error("--num-samples, --block and every --concurrency must be at least 1")


def variants_argument(ap: argparse.ArgumentParser, variants: dict, default: Sequence[str]) -> None:
    """--variants: which of `variants` to run, comma-separated (`default` unless given)."""
    others = [v for v in variants if v not in default]
    ap.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(default),
        help=f"which, comma-separated (default {','.join(default)}"
        + (f"; also {','.join(others)})" if others else ")"),
    )


def chosen_variants(ap: argparse.ArgumentParser, args: argparse.Namespace, variants: dict) -> dict:
    """The variants --variants names, in `variants`' order; an unknown name is a usage error."""
    if unknown := sorted(set(args.variants) - set(variants)):
        ap.error(f"--variants: unknown {', '.join(unknown)}; pick from {', '.join(variants)}")
    return {name: v for name, v in variants.items() if name in args.variants}
