"""How fast this machine runs a decode step right now: every benchmark report carries it beside
the load average, before and after its measurements.

Why a probe of its own: on the project's cloud VM SmolLM2's decode step measured ~60 ms one
morning (a profile) and 2.5 s two hours later in a fresh process, with the load average at 1 and
plain Python and a small matrix at their usual speed (docs/benchmarks.md, "The machine's own
speed"); dropping the guest's page cache and compacting its memory brought it back to ~0.13 s,
so the slow state lived in how the guest's memory was laid out. So the probe does what a decode
step does: one row through SmolLM2-135M's 30 layers of projection
weights (425 MB of fp32, torch's own allocator), the same shapes, synthetic values, no model
files read.

    python -m benchmarks.machine_speed [--passes 5] [--layers 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

# SmolLM2-135M's projections per layer (in, out): q/k/v merged, o, gate/up merged, down.
LAYER_SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))
LAYERS = 30


def decode_pass_ms(passes: int = 5, layers: int = LAYERS) -> float:
    """Median milliseconds of one row through `layers` layers of SmolLM2-sized weights, one
    thread (torch's threads restored afterwards)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        weights = [torch.full((o, i), 1e-3) for _ in range(layers) for i, o in LAYER_SHAPES]
        wide = {i: torch.full((1, i), 1.0) for i, _ in LAYER_SHAPES}
        with torch.inference_mode():

            def one_pass() -> float:
                start = time.perf_counter()
                for w in weights:
                    torch.nn.functional.linear(wide[w.shape[1]], w)
                return 1e3 * (time.perf_counter() - start)

            one_pass()  # first touch of the pages
            return statistics.median(one_pass() for _ in range(passes))
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.machine_speed",
        description="Time a decode-shaped pass on this machine now (check it before benchmarking).",
    )
    ap.add_argument("--passes", type=int, default=5, help="passes timed (the median is printed)")
    ap.add_argument("--layers", type=int, default=LAYERS, help="SmolLM2-sized layers per pass")
    args = ap.parse_args(argv)
    if args.passes < 1 or args.layers < 1:
        ap.error("--passes and --layers must be at least 1")
    ms = decode_pass_ms(args.passes, args.layers)
    print(f"decode-shaped pass ({args.layers} layers, median of {args.passes}): {ms:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
