"""The TTFT benchmark's summary (benchmarks/bench_ttft.py): per (path, prompt length) the median
TTFT cold and warm, what the warm-up saved, and where the TTFT went (experiments/pd_breakdown.py's
parts of each request, `sent_unix` its time origin); and ttft.md's table of it all."""

from __future__ import annotations

import statistics

from benchmarks.bench_meta import provenance
from experiments.pd_breakdown import COMPONENTS, UNATTRIBUTED, UNKNOWN, median_parts
from experiments.pd_breakdown import request_breakdown as agent_breakdown
from experiments.results import AgentTrace

CONDITIONS = ("cold", "warm")
PATHS = ("router", "dual")
# The breakdown's columns in ttft.md, in critical-path order.
PARTS = (*COMPONENTS, UNATTRIBUTED)


def request_breakdown(row: dict) -> dict[str, float | None] | None:
    """Seconds of each PD part of one benchmark row's request (pd_breakdown's parts, None where
    unknown): the row is read as an agent trace whose session began at its `sent_unix`."""
    if row.get("first_token_unix") is None:
        return None
    agent = AgentTrace(
        model="",
        final_request_s=0.0,
        first_token_s=row["first_token_unix"] - row["sent_unix"],
        worker_timing=row.get("worker_timing", {}),
    )
    return agent_breakdown(agent, row["sent_unix"])


def breakdown_ms(rows: list[dict]) -> dict[str, float | str]:
    """Median milliseconds per part (and `ttft`) over the rows, "unknown" where no row knows it
    (without SGLang's --enable-metrics, and the prefill side through the native router)."""
    parts = [b for r in rows if (b := request_breakdown(r)) is not None]
    return {
        k: v if v == UNKNOWN else 1e3 * v
        for k, v in median_parts(parts).items()
        if k in (*PARTS, "ttft")
    }


def summarize(rows: list[dict]) -> list[dict]:
    """Per (path, prompt length): median TTFT cold and warm, what the warm-up saved (median of
    the per-repetition differences and ratios: each repetition's pair shares its prompt), and
    the median breakdown of either condition's requests."""
    groups: dict[tuple[str, int], dict[str, dict[int, dict]]] = {}
    for r in rows:
        g = groups.setdefault((r["path"], r["prompt_tokens"]), {c: {} for c in CONDITIONS})
        g[r["condition"]][r["rep"]] = r
    out = []
    for (path, length), g in sorted(
        groups.items(), key=lambda kv: (PATHS.index(kv[0][0]), kv[0][1])
    ):
        reps = sorted(set(g["cold"]) & set(g["warm"]))
        if not reps:
            continue
        cold = [g["cold"][i]["ttft_s"] for i in reps]
        warm = [g["warm"][i]["ttft_s"] for i in reps]
        out.append(
            {
                "path": path,
                "prompt_tokens": length,
                "n": len(reps),
                "cold_ttft_ms": 1e3 * statistics.median(cold),
                "warm_ttft_ms": 1e3 * statistics.median(warm),
                "saved_ms": 1e3 * statistics.median(c - w for c, w in zip(cold, warm)),
                "warm_over_cold": statistics.median(w / c for c, w in zip(cold, warm)),
                "warm_cached_tokens": statistics.median(
                    g["warm"][i]["cached_tokens"] for i in reps
                ),
                "cold_cached_tokens": statistics.median(
                    g["cold"][i]["cached_tokens"] for i in reps
                ),
                "breakdown_ms": {c: breakdown_ms([g[c][i] for i in reps]) for c in CONDITIONS},
            }
        )
    return out


def _ms(value: float | str | None) -> str:
    return "?" if value is None or value == UNKNOWN else f"{value:.1f}"


def format_table(summary: list[dict]) -> str:
    """One row per (path, prompt length); each breakdown column is "cold / warm" median ms."""
    parts = [p.replace("_", " ") for p in PARTS]
    lines = [
        "| path | prompt tokens | n | TTFT cold (ms) | TTFT warm (ms) | saved (ms) | warm ÷ cold "
        "| cached tokens warm / cold | "
        + " | ".join(f"{p} (ms) cold / warm" for p in parts)
        + " |",
        "|---" * (8 + len(PARTS)) + "|",
    ]
    for s in summary:
        b = s.get("breakdown_ms", {})
        cells = [
            f"{_ms(b.get('cold', {}).get(p))} / {_ms(b.get('warm', {}).get(p))}" for p in PARTS
        ]
        lines.append(
            f"| {s['path']} | {s['prompt_tokens']} | {s['n']} | {s['cold_ttft_ms']:.1f} | "
            f"{s['warm_ttft_ms']:.1f} | {s['saved_ms']:.1f} | {s['warm_over_cold']:.3f} | "
            f"{s['warm_cached_tokens']:.0f} / {s['cold_cached_tokens']:.0f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def report(summary: list[dict], meta: dict) -> str:
    """ttft.md: what was measured and how, the table, the provenance."""
    return "\n".join(
        [
            (
                f"TTFT through the PD path of model `{meta['model']}` ({meta['backend']}, "
                f"{meta['device']}), warm-up verb `{meta['warmup_verb']}`, medians of "
                f"{meta['reps']} repetitions, cold and warm interleaved, the prefill caches "
                "flushed before each request; warm = warm-up of the prompt without its last "
                f"{meta['tail']} tokens. `router`: through the native sglang-router; `dual`: the "
                "shell router's successor path (prefill and decode worker addressed directly). "
                "Cached tokens: the prefill worker's count on `dual`, decode's on `router`. "
                "Where the TTFT went (experiments/pd_breakdown.py's parts, from the workers' "
                "meta_info, the request's sending the origin): median ms cold / warm; `?` where "
                "no request reported it (the prefill side through the native router; every part "
                "without SGLang's --enable-metrics)."
            ),
            "",
            *(
                ["**Interrupted**: the rows measured before the stop.", ""]
                if meta["interrupted"]
                else []
            ),
            format_table(summary),
            "",
            provenance(meta),
            "",
        ]
    )
