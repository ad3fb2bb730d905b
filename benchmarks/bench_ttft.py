"""TTFT through a model's PD deployment, cold vs after a warm-up, per prompt length (issue 19's
GPU benchmark; it runs on the reference engine too). Writes rows.jsonl, summary.json, ttft.md.

Each repetition draws a fresh random prompt per length and measures it cold and warm (order
alternating), on two paths: `router`, the model's native sglang-router (prefill + decode behind
it, as first-layer agents are sent), and `dual`, the shell router's own successor path
(router/pd.py `Deployment.dual`: the same JSON to a pinned prefill worker and a decode worker),
whose prefill reply carries the prefill worker's meta_info (the native router drains it). The
prefill workers' radix caches are flushed before each measurement; "warm" first sends the
router's own warm-up (`Deployment.warmup`: /generate to the fake bootstrap host, or
/prefill_only) of the prompt without its last `--tail` tokens, as a successor's final request
adds its template's tail.
Raw meta_info (first and last streamed chunk, the prefill reply), its numbers as `worker_timing`
("prefill.KEY", "decode.KEY") and client wall clocks (Unix seconds, the clock of SGLang's
timestamps: `sent_unix`, `first_token_unix`) go into every row; summary.json and ttft.md give the
PD-path breakdown from them (benchmarks/ttft_summary.py; SGLang reports the timings with
--enable-metrics only, and through the native router only decode's side).

    python -m benchmarks.bench_ttft --config tree_3_1_cpu --lengths 64,256 --reps 3 --out D
    python -m benchmarks.bench_ttft --cluster D/cluster.json --model NAME --out D2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.bench_meta import BenchRun, device_name
from benchmarks.microbench import LOW_TOKEN_ID, BenchError, flush
from benchmarks.ttft_summary import CONDITIONS, PATHS, report, summarize
from launch.signals import sigterm_as_ctrl_c
from profiling.measure import model_vocab
from router.cluster import ClusterSpec, load_cluster
from router.pd import Deployment, PrefillTarget
from router.sglang_client import WorkerError
from sglang_ext import protocol as P


# --- pure parts (tests/test_bench_ttft.py) --------------------------------------------------------
def parse_ints(text: str, what: str) -> list[int]:
    """ "256,1024" -> [256, 1024]; every value a positive integer."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: {text!r} is not a comma-separated list of ints")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{what}: give positive integers, e.g. 256,1024")
    return values


def parse_paths(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in PATHS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--paths: {text!r}; name some of {','.join(PATHS)}")
    return [p for p in PATHS if p in names]


def order(rep: int, paths: list[str]) -> list[tuple[str, str]]:
    """(condition, path) pairs of one repetition: cold first on even reps, warm first on odd ones,
    so a drift over the run hits both conditions alike."""
    conds = CONDITIONS if rep % 2 == 0 else CONDITIONS[::-1]
    return [(c, p) for c in conds for p in paths]


def prompt_vocab(model_path: str, tokenizer_path: str) -> int:
    """Random prompt ids stay below both the model's vocabulary and its tokenizer's
    (profiling.measure.model_vocab, which `moa-pd profile` uses too)."""
    try:
        return model_vocab(model_path, tokenizer_path)
    except ValueError as e:
        raise BenchError(str(e)) from None


def worker_timing(prefill: dict, decode_first: dict, decode_last: dict) -> dict[str, float]:
    """Every numeric meta_info value as "prefill.KEY" / "decode.KEY" (decode's first chunk wins:
    it carries the first token's own times), the shape of an agent trace's worker_timing, so a
    PD-path breakdown of agent traces applies to these rows with sent_unix as the time origin."""
    decode = {**decode_last, **decode_first}
    return {
        f"{side}.{k}": float(v)
        for side, meta in (("prefill", prefill), ("decode", decode))
        for k, v in meta.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


# --- the measurements -----------------------------------------------------------------------------
@dataclass(slots=True)
class Bench:
    dep: Deployment
    session: aiohttp.ClientSession
    output_len: int
    tail: int

    async def flush_all(self) -> None:
        """Empty every prefill worker's radix cache (a PD decode worker keeps none, as in
        SGLang: its KV arrives with each request)."""
        for url in self.dep.spec.prefill_urls:
            await flush(self.session, url)

    async def warm(self, prompt: list[int], path: str, target: PrefillTarget) -> dict:
        """The router's warm-up of the prompt minus its tail: to the dual path's pinned prefill
        worker, or to every prefill worker when the native router picks one itself."""
        prefix = prompt[: max(1, len(prompt) - self.tail)]
        spec = self.dep.spec
        targets = (
            [target]
            if path == "dual"
            else [
                PrefillTarget(i, url, spec.bootstrap_port(i), 0, spec.prefill_dp_size)
                for i, url in enumerate(spec.prefill_urls)
            ]
        )
        metas = []
        for t in targets:
            rid = f"{P.WARMUP_RID_PREFIX}{uuid.uuid4().hex}"
            metas.append(await self.dep.warmup(t, prefix, rid))
        return {"warmup_tokens": len(prefix), "warmup_meta": metas}

    async def one(self, prompt: list[int], condition: str, path: str) -> dict:
        """One request: flush, warm up if asked, then time send → first token → last chunk."""
        await self.flush_all()
        target = self.dep.pick_prefill()
        try:
            row: dict = {"warmup_tokens": 0}
            if condition == "warm":
                row.update(await self.warm(prompt, path, target))
            body = {
                P.INPUT_IDS: prompt,
                P.SAMPLING_PARAMS: {
                    P.MAX_NEW_TOKENS: self.output_len,
                    P.TEMPERATURE: 0.0,
                    P.IGNORE_EOS: True,
                },
                P.RID: f"ttft-{uuid.uuid4().hex}",
            }
            sent_unix, t0 = time.time(), time.perf_counter()
            call = self.dep.via_router(body) if path == "router" else self.dep.dual(body, target)
            ttft = first_unix = None
            first_meta: dict = {}
            last_meta: dict = {}
            async for chunk in call.stream:
                if ttft is None and chunk.get(P.OUTPUT_IDS):
                    ttft, first_unix = time.perf_counter() - t0, time.time()
                    first_meta = chunk.get(P.META_INFO, {})
                last_meta = chunk.get(P.META_INFO, last_meta)
            latency = time.perf_counter() - t0
        finally:
            self.dep.unpin(target)
        if ttft is None:
            raise BenchError(f"{path} path: no streamed chunk carried output ids")
        prefill_meta = call.prefill.meta
        # The prefill worker's count where we have it (dual); decode's copy otherwise, which
        # some SGLang versions leave at 0 (sglang-notes fact 7).
        cached = prefill_meta.get(P.CACHED_TOKENS, last_meta.get(P.CACHED_TOKENS, 0))
        return {
            **row,
            "ttft_s": ttft,
            "latency_s": latency,
            "sent_unix": sent_unix,
            "first_token_unix": first_unix,
            "prefill_reply_s": None if call.prefill.at is None else call.prefill.at - t0,
            "cached_tokens": int(cached or 0),
            "meta_first": first_meta,
            "meta_last": last_meta,
            "prefill_meta": dict(prefill_meta),
            "worker_timing": worker_timing(prefill_meta, first_meta, last_meta),
        }


async def run(
    cluster: ClusterSpec, model: str, a: argparse.Namespace, vocab: int, sink, rows: list[dict]
) -> None:
    """Measure into `rows` (and `sink`, a line each), so an interrupted run keeps its rows."""
    from tqdm import tqdm

    from router.context import RouterContext

    rng = random.Random(a.seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        dep = RouterContext(cluster, session, seed=a.seed).deployments[model]
        bench = Bench(dep, session, a.output_len, a.tail)
        # One-off costs (allocators, lazy init, Triton compiles per shape: 34 s for the first
        # warm-up of an 8B worker on an H200) are paid here, per length and path, unmeasured.
        for length in a.lengths:
            prompt = [rng.randrange(LOW_TOKEN_ID, vocab) for _ in range(length)]
            for cond, path in order(0, a.paths):
                await bench.one(prompt, cond, path)
        total = a.reps * len(a.lengths) * len(a.paths) * len(CONDITIONS)
        with tqdm(total=total, desc="ttft", unit="req") as bar:
            for rep in range(a.reps):
                for length in a.lengths:
                    prompt = [rng.randrange(LOW_TOKEN_ID, vocab) for _ in range(length)]
                    for cond, path in order(rep, a.paths):
                        row = await bench.one(prompt, cond, path)
                        row = {
                            "rep": rep,
                            "prompt_tokens": length,
                            "condition": cond,
                            "path": path,
                            **row,
                        }
                        rows.append(row)
                        sink.write(json.dumps(row) + "\n")
                        sink.flush()
                        bar.set_postfix(L=length, c=cond, p=path, ms=f"{1e3 * row['ttft_s']:.1f}")
                        bar.update()


def pick_model(cluster: ClusterSpec, model: str | None, where: str) -> str:
    if model is None:
        if len(cluster.models) != 1:
            raise BenchError(
                f"{where} serves {len(cluster.models)} models ({', '.join(cluster.models)}); "
                "name one with --model"
            )
        return next(iter(cluster.models))
    if model not in cluster.models:
        raise BenchError(
            f"{where} serves no model '{model}' (served: {', '.join(cluster.models)}); fix --model"
        )
    return model


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--cluster", help="cluster.json of a running deployment (moa-pd up)")
    src.add_argument("--config", help="bring a deployment of this config up (and down after)")
    p.add_argument("--model", help="the model to measure (default: the only one served)")
    p.add_argument("--backend", choices=["torch", "sglang"], default="torch", help="with --config")
    p.add_argument(
        "--warmup-verb",
        choices=["generate", "prefill_only"],
        help="how warm-ups are sent (default: the deployment's, from cluster.json)",
    )
    p.add_argument(
        "--lengths",
        type=lambda t: parse_ints(t, "--lengths"),
        default=[256, 1024, 2048, 4096],
        help="prompt lengths in tokens (default 256,1024,2048,4096)",
    )
    p.add_argument("--reps", type=int, default=10, help="repetitions per length (default 10)")
    p.add_argument(
        "--paths",
        type=parse_paths,
        default=list(PATHS),
        help=f"which request paths to time, from {','.join(PATHS)} (default both)",
    )
    p.add_argument("--tail", type=int, default=32, help="prompt tokens the warm-up leaves out")
    p.add_argument("--output-len", type=int, default=4, help="tokens generated per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for rows.jsonl, summary.json, ttft.md")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_ttft", description=__doc__.split("\n\n")[0]
    )
    add_arguments(p)
    a = p.parse_args(argv)
    if a.reps < 1 or a.output_len < 1 or a.tail < 0:
        p.error("--reps and --output-len must be at least 1, --tail at least 0")
    if a.tail >= min(a.lengths):
        p.error(f"--tail {a.tail} leaves nothing to warm up at length {min(a.lengths)}")
    from launch.procs import LaunchError

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = BenchRun("benchmarks.bench_ttft", argv if argv is not None else sys.argv[1:])
    stack, rows, interrupted = None, [], False
    # SIGTERM (a `timeout`) stops it as Ctrl-C does: the deployment goes down, the rows so far
    # are summarized (as for moa-pd).
    sigterm_as_ctrl_c()
    try:
        if a.config:
            from launch.commands import bring_up, make_stack

            stack = make_stack([a.config], a.backend, out / "deploy", "127.0.0.1")
            bring_up(stack)  # returns once every model's router routes (Stack.up waits)
            cluster, where, backend = (
                load_cluster(stack.cluster_path),
                f"config {a.config}",
                a.backend,
            )
        else:
            cluster, where = load_cluster(a.cluster), a.cluster
            backend = json.loads(Path(a.cluster).read_text()).get("backend", "?")
        if a.warmup_verb:
            cluster = cluster.model_copy(update={"warmup_verb": a.warmup_verb})
        model = pick_model(cluster, a.model, where)
        spec = cluster.models[model]
        vocab = prompt_vocab(spec.model_path, spec.tokenizer_path)
        if vocab <= LOW_TOKEN_ID:
            raise BenchError(f"model {model}'s vocabulary ({vocab}) is too small for the prompts")
        with open(out / "rows.jsonl", "w") as sink:
            asyncio.run(run(cluster, model, a, vocab, sink, rows))
    except (BenchError, LaunchError, WorkerError, aiohttp.ClientError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; rows so far are in {out / 'rows.jsonl'}", file=sys.stderr)
        interrupted = True
    finally:
        if stack is not None:
            stack.down()
    if not rows:
        return 130 if interrupted else 1
    summary = summarize(rows)
    meta = bench.meta(
        interrupted=interrupted,
        model=model,
        backend=backend,
        device=device_name(),
        warmup_verb=cluster.warmup_verb,
        reps=a.reps,
        lengths=a.lengths,
        paths=a.paths,
        tail=a.tail,
        output_len=a.output_len,
        # Without SGLang's --enable-metrics the workers report no timings: no breakdown then.
        rows_with_worker_timing=sum(
            f"decode.{P.FORWARD_ENTRY_TIME}" in r["worker_timing"] for r in rows
        ),
    )
    (out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1))
    text = report(summary, meta)
    (out / "ttft.md").write_text(text)
    print(text)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
