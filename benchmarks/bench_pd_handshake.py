"""The fixed cost of one PD request: its handshake (decode's destination reaching prefill) and its
KV transfer, on a running deployment's prefill/decode pair, for the same probe prompt in three
states of the decode worker:

- `fresh`: as the deployment is (run it right after `moa-pd up` for a fresh pool);
- `after_streams`: idle again after K streams of different lengths decoded side by side and
  ended (what a question leaves behind: the pages those streams held are free again);
- `beside_streams`: while K long streams decode (the probe waits for decode's steps).

Each probe goes to both workers with one bootstrap room, as the shell router sends an agent's
request, and is cut with the workers' own meta_info timings (SGLang's names):
`handshake` = prefill's waiting-queue entry - the later of the two workers receiving it;
`transfer` = decode's waiting-queue entry - the end of prefill's forward. Probes run one at a
time. Writes OUT/pd_handshake.json and OUT/bench_pd_handshake.md.

    moa-pd up --config tree_9_3_1_cpu --run-dir runs/pd_handshake/deploy --detach
    OMP_NUM_THREADS=1 python -m benchmarks.bench_pd_handshake \\
        --cluster runs/pd_handshake/deploy/cluster.json --out runs/pd_handshake
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from pathlib import Path

import aiohttp

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from sglang_ext import protocol as P

# Token ids well inside SmolLM2's vocabulary and past its special tokens.
TOKEN_IDS = range(100, 40_000)


def _body(input_ids: list[int], new_tokens: int, room: int, bootstrap_port: int) -> dict:
    return {
        "input_ids": input_ids,
        P.SAMPLING_PARAMS: {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
        P.STREAM: True,
        P.RID: f"handshake-probe-{room}",
        P.BOOTSTRAP_HOST: "127.0.0.1",
        P.BOOTSTRAP_PORT: bootstrap_port,
        P.BOOTSTRAP_ROOM: room,
    }


class Pair:
    """One model's prefill/decode pair from cluster.json, and requests sent to both."""

    def __init__(self, cluster: dict, model: str | None, seed: int = 0):
        models = cluster["models"]
        name = model or next(iter(models))
        if name not in models:
            raise SystemExit(f"--model {name!r} is not in the cluster (it has {sorted(models)})")
        m = models[name]
        self.prefill, self.decode = m["prefill_urls"][0], m["decode_urls"][0]
        self.bootstrap_port = m["bootstrap_ports"][0]
        self.rng = random.Random(seed)

    def prompt(self, tokens: int) -> list[int]:
        return [self.rng.choice(TOKEN_IDS) for _ in range(tokens)]

    async def request(
        self, s: aiohttp.ClientSession, input_ids: list[int], new_tokens: int
    ) -> tuple[dict, dict]:
        """(prefill's meta_info, decode's last meta_info) of one PD request."""
        body = _body(input_ids, new_tokens, self.rng.randrange(1 << 40), self.bootstrap_port)
        prefill = asyncio.ensure_future(
            s.post(f"{self.prefill}/generate", json={**body, P.STREAM: False})
        )
        decode_meta: dict = {}
        try:
            async with s.post(f"{self.decode}/generate", json=body) as resp:
                await _ok(resp, self.decode)
                async for raw in resp.content:
                    chunk = P.parse_sse_line(raw.decode())
                    if chunk is not None:
                        decode_meta.update(chunk.get(P.META_INFO, {}))
            async with await prefill as resp:
                await _ok(resp, self.prefill)
                return (await resp.json()).get(P.META_INFO, {}), decode_meta
        finally:
            prefill.cancel()  # a no-op once awaited; ends it where the stream was cancelled


async def _ok(resp: aiohttp.ClientResponse, url: str) -> None:
    if resp.status != 200:
        raise SystemExit(f"{url}/generate answered {resp.status}: {(await resp.text())[:300]}")


def cut(prefill: dict, decode: dict) -> dict[str, float] | None:
    """Milliseconds of the probe's handshake and transfer; None without the workers' timings."""
    try:
        received = max(prefill[P.REQUEST_RECEIVED_TS], decode[P.REQUEST_RECEIVED_TS])
        prefill_queued = prefill[P.FORWARD_ENTRY_TIME] - prefill[P.QUEUE_TIME]
        decode_queued = decode[P.FORWARD_ENTRY_TIME] - decode[P.QUEUE_TIME]
        return {
            "handshake_ms": 1e3 * (prefill_queued - received),
            "transfer_ms": 1e3 * (decode_queued - prefill[P.PREFILL_FINISHED_TIME]),
        }
    except KeyError:
        return None


async def probes(pair: Pair, s: aiohttp.ClientSession, n: int, tokens: int) -> list[dict]:
    out = []
    for _ in range(n):
        parts = cut(*await pair.request(s, pair.prompt(tokens), 2))
        if parts is None:
            raise SystemExit(
                "the workers' replies carry no timings: start them with --enable-metrics "
                "(`moa-pd up` does)"
            )
        out.append(parts)
        await asyncio.sleep(0.2)
    return out


async def measure(args) -> dict[str, list[dict]]:
    pair = Pair(json.loads(Path(args.cluster).read_text()), args.model)
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    results: dict[str, list[dict]] = {}
    async with aiohttp.ClientSession(timeout=timeout) as s:
        results["fresh"] = await probes(pair, s, args.probes, args.prompt_tokens)
        print(f"fresh: {summary(results['fresh'])}", flush=True)
        # Streams of different lengths, side by side: they end at different steps.
        lengths = [args.stream_tokens * (i + 1) // args.streams for i in range(args.streams)]
        await asyncio.gather(*(pair.request(s, pair.prompt(40), n) for n in lengths))
        results["after_streams"] = await probes(pair, s, args.probes, args.prompt_tokens)
        print(f"after_streams: {summary(results['after_streams'])}", flush=True)
        load = [
            asyncio.ensure_future(pair.request(s, pair.prompt(40), 4 * args.stream_tokens))
            for _ in range(args.streams)
        ]
        await asyncio.sleep(2.0)  # all of them decoding
        try:
            results["beside_streams"] = await probes(pair, s, args.probes, args.prompt_tokens)
        finally:
            for f in load:
                f.cancel()
            await asyncio.gather(*load, return_exceptions=True)
        print(f"beside_streams: {summary(results['beside_streams'])}", flush=True)
    return results


def median_range(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def summary(rows: list[dict]) -> str:
    return ", ".join(f"{k} {median_range(rows, k)}" for k in ("handshake_ms", "transfer_ms"))


def report(results: dict[str, list[dict]], args) -> str:
    lines = [
        "| decode worker | probes | handshake ms, median (range) | transfer ms, median (range) |",
        "|---|---|---|---|",
    ]
    for state, rows in results.items():
        lines.append(
            f"| {state} | {len(rows)} | {median_range(rows, 'handshake_ms')} "
            f"| {median_range(rows, 'transfer_ms')} |"
        )
    return (
        f"{args.prompt_tokens}-token probe prompts; {args.streams} streams of up to "
        f"{args.stream_tokens} new tokens.\n\n" + "\n".join(lines) + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True, help="cluster.json of `moa-pd up`")
    ap.add_argument("--model", default=None, help="the model's name in it (default: the first)")
    ap.add_argument("--probes", type=int, default=8, help="probe requests per state")
    ap.add_argument("--prompt-tokens", type=int, default=480)
    ap.add_argument("--streams", type=int, default=8, help="streams decoding side by side")
    ap.add_argument("--stream-tokens", type=int, default=96, help="the longest stream's tokens")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--out", default="runs/bench_pd_handshake")
    args = ap.parse_args(argv)
    if min(args.probes, args.prompt_tokens, args.streams, args.stream_tokens) < 1:
        ap.error("--probes, --prompt-tokens, --streams and --stream-tokens must be at least 1")
    if not Path(args.cluster).is_file():
        ap.error(f"--cluster {args.cluster}: no such file (start one with `moa-pd up`)")
    bench = BenchRun("benchmarks.bench_pd_handshake")
    try:
        results = asyncio.run(measure(args))
    except aiohttp.ClientError as e:
        raise SystemExit(f"{args.cluster}: cannot reach its workers ({e}); is the deployment up?")
    meta = bench.meta(cluster=args.cluster, device=cpu_device(False))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pd_handshake.json").write_text(json.dumps({"meta": meta, "probes": results}, indent=1))
    md = "# A PD request's handshake and KV transfer\n\n" + provenance(meta) + "\n\n"
    md += report(results, args)
    (out / "bench_pd_handshake.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
