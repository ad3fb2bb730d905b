"""The engine's decode step with every projection on oneDNN's packed kernel (the default) against
the layers on MKL (the engine before stop 38; the lm_head packed in both), per batch size, in one
process, variants interleaved per repetition (order turning), medians. Also checks what the
packing is for: each variant's logits of sequence 0 at every batch size against its own batch of
one (bit for bit).

    python -m benchmarks.bench_projections [--batch-sizes 1,2,3,4,9,16] [--reps 5] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.model import CausalLM, make_kv_buffer
from sglang_ext.engine.model_store import resolve_model_path

VARIANTS = ("packed", "mkl")
CONTEXT = 172  # tokens of context per sequence, as the profile's decode points


class Decoder:
    """`batch` sequences of CONTEXT random tokens, prefilled once; `step()` decodes one token
    of each and returns the logits."""

    def __init__(self, model: CausalLM, batch: int, steps: int, seed: int = 0) -> None:
        self.model = model
        rng = random.Random(seed)
        total = CONTEXT + steps + 1
        self.kv = make_kv_buffer(model.config, batch * total, torch.float32)
        self.slots = [list(range(i * total, (i + 1) * total)) for i in range(batch)]
        prompts = [[rng.randrange(3, 40000) for _ in range(CONTEXT)] for _ in range(batch)]
        for s, p in zip(self.slots, prompts):  # one at a time: the same K/V in every batch
            self.last = model(ForwardBatch.build([s[:CONTEXT]], [p]), self.kv)
        self.tokens = [p[-1] for p in prompts]
        self.done = CONTEXT

    def step(self) -> torch.Tensor:
        self.done += 1
        batch = ForwardBatch.build([s[: self.done] for s in self.slots], [[t] for t in self.tokens])
        logits = self.model(batch, self.kv)
        self.tokens = [int(t) for t in logits.argmax(-1)]
        return logits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_projections", description=__doc__)
    ap.add_argument("--model-path", default="smollm2-135m")
    ap.add_argument("--batch-sizes", default="1,2,3,4,9,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per repetition")
    ap.add_argument("--out", type=Path, help="write bench_projections.json and .md here")
    args = ap.parse_args(argv)
    run = BenchRun("benchmarks.bench_projections", argv if argv is not None else sys.argv[1:])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    path = resolve_model_path(args.model_path)
    models = {v: CausalLM.from_pretrained(path, pack_projections=v == "packed") for v in VARIANTS}
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    rows = []
    with torch.inference_mode():
        first = {v: Decoder(models[v], 1, 1).step()[0] for v in VARIANTS}
        for n in sizes:
            ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
            invariant = {
                v: torch.equal(Decoder(models[v], n, 1).step()[0], first[v]) for v in VARIANTS
            }
            for rep in range(args.reps):
                for v in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
                    dec = Decoder(models[v], n, args.steps, seed=rep)
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        dec.step()
                    ms[v].append(1000 * (time.perf_counter() - start) / args.steps)
            ratios = [p / m for p, m in zip(ms["packed"], ms["mkl"])]
            rows.append(
                {
                    "batch": n,
                    "packed_ms": statistics.median(ms["packed"]),
                    "mkl_ms": statistics.median(ms["mkl"]),
                    "ratio": statistics.median(ratios),
                    "ratios": ratios,
                    "invariant": invariant,
                }
            )
            print(
                f"batch {n}: packed {rows[-1]['packed_ms']:.1f} ms, MKL {rows[-1]['mkl_ms']:.1f}"
                f" ms per step, ratio {rows[-1]['ratio']:.3f}; same logits as alone: {invariant}",
                flush=True,
            )
    meta = run.meta(device=cpu_device(), reps=args.reps, steps=args.steps, context=CONTEXT)
    lines = [
        "| rows | packed ms/step | MKL ms/step | packed ÷ MKL (median of per-rep) "
        + "| sequence 0's logits = alone (packed / MKL) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['batch']} | {r['packed_ms']:.1f} | {r['mkl_ms']:.1f} | {r['ratio']:.3f} |"
        f" {r['invariant']['packed']} / {r['invariant']['mkl']} |"
        for r in rows
    ]
    report = "\n".join(lines) + "\n\n" + provenance(meta) + "\n"
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_projections.json").write_text(
            json.dumps({"rows": rows, **meta}, indent=1)
        )
        (args.out / "bench_projections.md").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
