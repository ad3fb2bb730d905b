"""`moa-pd dummy-model`: write a shape-only model directory (a real architecture's config.json,
the embedded SmolLM2 tokenizer, no weights) to serve with `--load-format dummy`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(args: argparse.Namespace) -> int:
    from sglang_ext.engine.dummy_model import write_dummy_model
    from sglang_ext.engine.model_store import SMOLLM2_NAMES, resolve_model_path

    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        print(
            f"error: {out} exists and is not empty; pick another --out or add --force",
            file=sys.stderr,
        )
        return 2
    try:
        write_dummy_model(args.shape, out, resolve_model_path(SMOLLM2_NAMES[0]))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = json.loads((out / "config.json").read_text())
    print(
        f"wrote {out}: {args.shape} ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
        f"{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} heads, vocab {cfg['vocab_size']}); "
        f"serve it with --load-format dummy, or name it in a config as "
        f'"model_path": "dummy:{args.shape}"'
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sglang_ext.engine.dummy_model import SHAPES

    p.add_argument("--shape", required=True, choices=list(SHAPES), help="the architecture")
    p.add_argument("--out", required=True, help="the directory to write")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
