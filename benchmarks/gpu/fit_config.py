"""A copy of a weight-free config with its models swapped for smaller dummy shapes, so a tree
whose real trio does not fit the GPUs given (4B/8B/32B: 2 × 85 GiB of weights as PD pairs) still
runs with the same topology, prompts and output lengths. Models are renamed after their new
shape, and every agent follows its model.

    python -m benchmarks.gpu.fit_config tree_9_3_1_dummy_gpu \\
        --map qwen3-4b=qwen3-1.7b,qwen3-8b=qwen3-4b,qwen3-32b=qwen3-8b --out D/tree_fit.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from router.config_loader import ConfigError, resolve_config_path


def parse_map(text: str) -> dict[str, str]:
    """ "a=b,c=d" -> {"a": "b", "c": "d"}."""
    pairs = [p.strip() for p in text.split(",") if p.strip()]
    if not pairs or any(p.count("=") != 1 for p in pairs):
        raise ValueError(f"--map {text!r}: give MODEL=SHAPE pairs, e.g. qwen3-32b=qwen3-8b")
    return dict(p.split("=") for p in pairs)


def fit(raw: dict, mapping: dict[str, str], suffix: str = "_fit") -> dict:
    """`raw` (a config's JSON) with model KEY served as dummy:SHAPE under the name SHAPE."""
    models = raw["models"]
    unknown = sorted(set(mapping) - set(models))
    if unknown:
        raise ValueError(
            f"config '{raw['name']}' has no model {', '.join(unknown)} (it has "
            f"{', '.join(models)}); fix --map"
        )
    rename = {k: mapping.get(k, k) for k in models}
    if len(set(rename.values())) != len(rename):
        raise ValueError(f"--map gives two models one name: {rename}")
    out = dict(raw)
    out["name"] = raw["name"] + suffix
    swapped = ", ".join(f"{k} -> {v}" for k, v in mapping.items())
    out["description"] = f"{raw.get('description', '')} Shapes swapped to fit: {swapped}.".strip()
    out["models"] = {
        rename[k]: {**spec, "model_path": f"dummy:{mapping[k]}"} if k in mapping else spec
        for k, spec in models.items()
    }
    out["agents"] = [{**a, "model": rename[a["model"]]} for a in raw["agents"]]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.fit_config", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("config", help="a config's name or path")
    p.add_argument("--map", required=True, help="MODEL=SHAPE,... (dummy shapes)")
    p.add_argument("--out", required=True, help="the new config file")
    p.add_argument("--suffix", default="_fit", help="appended to the config's name")
    a = p.parse_args(argv)
    try:
        path = resolve_config_path(a.config)
        fitted = fit(json.loads(Path(path).read_text()), parse_map(a.map), a.suffix)
    except (ConfigError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(fitted, indent=2) + "\n")
    print(f"wrote {a.out}: {fitted['name']} ({', '.join(fitted['models'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
