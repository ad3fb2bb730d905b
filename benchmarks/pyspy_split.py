"""Split a py-spy raw profile of the shell router by what it does (issue 28, item 1): each
sample goes to the part named by its innermost frame that names one (event-loop polling,
tokenizing, stream parsing, splicing, early exit, the gate, orchestration, HTTP, metrics,
asyncio's machinery), and the shares are printed.

    py-spy record -p ROUTER_PID -r 50 -f raw --nonblocking -o router.txt   # during a run
    python -m benchmarks.pyspy_split router.txt
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

# (part, regex on a frame "function (file:line)"), tried on the innermost frame first.
PARTS = [
    ("event-loop polling", r"selectors\.py|epoll|_run_once .*base_events"),
    ("tokenizing", r"router/tokenizers\.py|hf_tokenizer|tokenization_|tokenizers/"),
    ("stream parsing", r"stream_reader\.py|sglang_client\.py"),
    (
        "splicing, incremental prefill",
        r"incremental\.py|successor_prompt\.py|answer_cache\.py|template\.py",
    ),
    ("early exit", r"early_exit|majority_vote|embedder\.py"),
    (
        "gate, priority, replica choice",
        r"prefill_gate\.py|priority\.py|compute_device\.py|request_split\.py|router/pd\.py",
    ),
    ("orchestration", r"agent_runner\.py|orchestrator\.py|sessions\.py|trace\.py"),
    ("HTTP (aiohttp, JSON)", r"aiohttp|json|multidict|yarl"),
    ("metrics, lag probe", r"router/metrics\.py|loop_lag\.py|prometheus"),
    ("asyncio machinery", r"asyncio"),
]


def split(lines: list[str]) -> tuple[int, collections.Counter]:
    """(samples, part -> samples) of py-spy's raw lines ("frame;frame;... count")."""
    counts: collections.Counter = collections.Counter()
    total = 0
    for line in lines:
        if not line.strip():
            continue
        stack, n = line.rstrip("\n").rsplit(" ", 1)
        total += int(n)
        part = "other"
        for frame in reversed(stack.split(";")):
            hit = next((name for name, rx in PARTS if re.search(rx, frame)), None)
            if hit:
                part = hit
                break
        counts[part] += int(n)
    return total, counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="py-spy record -f raw output")
    args = ap.parse_args(argv)
    total, counts = split(Path(args.profile).read_text().splitlines())
    print(f"{total} samples")
    for part, n in counts.most_common():
        print(f"{100 * n / max(total, 1):5.1f}%  {part}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
