"""Micro-benchmark of one early-exit decision: embedding a finished output and `decide` at each
completion of a 3- and a 9-agent cluster, on 256-token outputs. Prints a markdown table for
docs/benchmarks.md.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m benchmarks.bench_early_exit
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from experiments.datasets import data_dir
from router.config import EarlyExit
from router.early_exit import AgentResult, SimilarityCache, decide
from router.embedder import Embedder

DATA = data_dir()  # the vendored splits


def realistic_outputs(embedder: Embedder, n_agents: int, n_tokens: int, question: int) -> list[str]:
    """Agent outputs for one GSM8K question: the reference solution (shared, as agreeing agents
    would write it) followed by different MATH-500 solutions, cut to exactly `n_tokens` rows."""
    gsm = [json.loads(x) for x in (DATA / "gsm8k/test.jsonl").read_text().splitlines()[:50]]
    math = [json.loads(x) for x in (DATA / "math500/test.jsonl").read_text().splitlines()[:200]]
    tok = embedder._tokenizer
    outputs = []
    for k in range(n_agents):
        text = gsm[question]["solution"]
        j = question * n_agents + k
        while len(tok(text, verbose=False)["input_ids"]) < n_tokens:
            text += "\n" + math[j % len(math)]["solution"]
            j += 7
        # n_tokens - 2 word pieces: the embedder adds [CLS] and [SEP].
        ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"][: n_tokens - 2]
        outputs.append(tok.decode(ids))
    return outputs


def time_cluster(embs: list[np.ndarray], cfg: EarlyExit, reps: int, rng) -> dict[str, list[float]]:
    """ms of `decide` at each completion ℓ ≥ 2, with the per-cluster cache carried (as the
    orchestrator calls it) and recomputed from scratch (every pair)."""
    n = len(embs)
    ids = [f"a{i}" for i in range(n)]
    agents = [AgentResult(ids[i], list(-rng.exponential(0.2, size=256)), embs[i]) for i in range(n)]
    out = {"incremental": [], "all_pairs": []}
    for rep in range(reps):
        cache = SimilarityCache()
        for ell in range(1, n + 1):
            d = decide("agg", agents[:ell], ids, cfg, f"q{rep}", cache)
            if ell >= cfg.min_completed:
                out["incremental"].append(d.seconds * 1e3)
        d = decide("agg", agents, ids, cfg, f"q{rep}")
        out["all_pairs"].append(d.seconds * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[3, 9])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--synthetic-hidden",
        type=int,
        nargs="*",
        default=[1024, 2560],
        help="also time decide on random [tokens, h] matrices (Qwen3-Embedding sizes)",
    )
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cfg = EarlyExit(enabled=True)

    embedder = Embedder("all-minilm-l6-v2")
    t0 = time.perf_counter()
    embedder.load()
    load_s = time.perf_counter() - t0
    rows = []
    for n in args.agents:
        texts = realistic_outputs(embedder, n, args.tokens, question=0)
        embedder.embed(texts[0])  # warm-up
        embed_ms, embs = [], []
        for text in texts:
            t0 = time.perf_counter()
            embs.append(embedder.embed(text))
            embed_ms.append((time.perf_counter() - t0) * 1e3)
        assert all(e.shape == (args.tokens, 384) for e in embs), [e.shape for e in embs]
        times = time_cluster(embs, cfg, args.reps, rng)
        rows.append(
            (
                "MiniLM-L6 (real) h=384",
                n,
                statistics.median(embed_ms),
                statistics.median(times["incremental"]),
                max(times["incremental"]),
                statistics.median(times["all_pairs"]),
            )
        )
        for h in args.synthetic_hidden:
            fake = [rng.normal(size=(args.tokens, h)).astype(np.float32) for _ in range(n)]
            times = time_cluster(fake, cfg, max(1, args.reps // 2), rng)
            rows.append(
                (
                    f"synthetic h={h}",
                    n,
                    float("nan"),
                    statistics.median(times["incremental"]),
                    max(times["incremental"]),
                    statistics.median(times["all_pairs"]),
                )
            )
    embedder.close()

    print(
        f"\nEmbedder load: {load_s:.2f} s; outputs of {args.tokens} tokens; "
        f"{args.reps} reps; OMP_NUM_THREADS as set in the environment.\n"
    )
    print(
        "| embeddings | agents | embed ms / output | decide ms (median, cached) "
        "| decide ms (max, cached) | decide ms (all pairs, ℓ = N) |"
    )
    print("|---|---|---|---|---|---|")
    for name, n, emb, med, worst, full in rows:
        emb_s = "—" if np.isnan(emb) else f"{emb:.1f}"
        print(f"| {name} | {n} | {emb_s} | {med:.2f} | {worst:.2f} | {full:.2f} |")


if __name__ == "__main__":
    main()
