"""Where a question's time goes: its critical path through the agent graph and the breakdown of
that path, and how much of what overlap could save a pipelined setting did save.

The critical path runs back from the final agent: a successor's final request waits for the
precursor that ended last, so that precursor is on the path, and so on down to a leaf. Along it:
- `leaf_prefill`: the leaf's request until its first token (prompt prefill, KV transfer);
- `exposed_prefill`: each successor's final request until its first token: the prefill the
  precursors' decoding did not hide (queue wait, the un-warmed part, KV transfer);
- `decode`: first token to end, for every agent on the path;
- `other`: the rest (router work between a precursor's end and its successor's request).

The possible gain of overlap on a question is blocking's exposed prefill on its critical path:
blocking's end-to-end time minus that is what a perfect overlap could reach. The realized gain is
blocking's e2e minus pipelined's, paired per question. Called by summary.py and the timeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from experiments.results import AgentTrace, ResultRow

PARTS = ("leaf_prefill", "exposed_prefill", "decode", "other")


def critical_path(agents: dict[str, AgentTrace], final: str) -> list[str]:
    """Agent ids from the leaf that started the path to `final`."""
    path = [final]
    while order := agents[path[-1]].slot_order:
        ran = [a for a in order if a in agents and agents[a].end_s is not None]
        if not ran:
            break
        path.append(max(ran, key=lambda a: agents[a].end_s))
    return path[::-1]


def final_agent(row: ResultRow) -> str | None:
    """The agent the answer came from: the deepest layer's (the one nobody reads)."""
    read = {p for a in row.agents.values() for p in a.slot_order}
    sinks = [a for a in row.agents if a not in read]
    return max(sinks, key=lambda a: row.agents[a].layer or 0) if sinks else None


def breakdown(row: ResultRow) -> dict[str, float] | None:
    """Seconds of each PART on the row's critical path; None when the trace lacks the times."""
    final = final_agent(row)
    if final is None:
        return None
    path = critical_path(row.agents, final)
    parts = dict.fromkeys(PARTS, 0.0)
    for agent_id in path:
        a = row.agents[agent_id]
        if None in (a.final_request_s, a.first_token_s, a.end_s):
            return None
        prefill = a.first_token_s - a.final_request_s
        parts["exposed_prefill" if a.slot_order else "leaf_prefill"] += prefill
        parts["decode"] += a.end_s - a.first_token_s
    parts["other"] = max(0.0, row.e2e_s - sum(parts.values()))
    return parts


def exposed_detail(row: ResultRow) -> dict[str, float] | None:
    """Summed over the successors on the row's critical path: `uncached_tokens`, the tokens
    each one's final request had to prefill itself (what warm-ups left: the last precursor's
    un-warmed tail and the template's tail after it), and `send_wait_s`, from its last
    precursor's end to its final request going out (the router's part: in pipelined mode, a
    loop that waited for its last warm-up's reply). None when the trace lacks them."""
    final = final_agent(row)
    if final is None:
        return None
    out = {"uncached_tokens": 0.0, "send_wait_s": 0.0}
    for agent_id in critical_path(row.agents, final):
        a = row.agents[agent_id]
        if not a.slot_order:
            continue
        ends = [row.agents[p].end_s for p in a.slot_order if p in row.agents]
        ends = [e for e in ends if e is not None]
        if a.prompt_tokens is None or a.cached_tokens is None or a.final_request_s is None:
            return None
        out["uncached_tokens"] += a.prompt_tokens - a.cached_tokens
        out["send_wait_s"] += max(0.0, a.final_request_s - max(ends)) if ends else 0.0
    return out


@dataclass(slots=True)
class OverlapGain:
    """Pipelined setting vs its blocking reference over the questions both ran without error."""

    questions: int
    possible_s: float  # Σ blocking's exposed prefill on its critical path
    realized_s: float  # Σ (blocking e2e - pipelined e2e)

    @property
    def realized_over_possible(self) -> float | None:
        return self.realized_s / self.possible_s if self.possible_s > 0 else None


def overlap_gain(
    rows: Sequence[ResultRow], dataset: str, pipelined: int, blocking: int
) -> OverlapGain | None:
    by_key = {(r.sample_id, r.setting): r for r in rows if r.dataset == dataset and r.ok}
    possible, realized, n = 0.0, 0.0, 0
    for (sid, s), piped in by_key.items():
        base = by_key.get((sid, blocking))
        if s != pipelined or base is None or (parts := breakdown(base)) is None:
            continue
        possible += parts["exposed_prefill"]
        realized += base.e2e_s - piped.e2e_s
        n += 1
    return OverlapGain(n, possible, realized) if n else None


def decode_by_layer(row: ResultRow) -> dict[int, float] | None:
    """Seconds of decoding on the row's critical path, per layer (its agents' first token to
    end); None when the trace lacks the times."""
    final = final_agent(row)
    if final is None:
        return None
    out: dict[int, float] = {}
    for agent_id in critical_path(row.agents, final):
        a = row.agents[agent_id]
        if a.first_token_s is None or a.end_s is None:
            return None
        out[a.layer or 0] = out.get(a.layer or 0, 0.0) + a.end_s - a.first_token_s
    return out


def gain_by_part(
    rows: Sequence[ResultRow], pipelined: int, blocking: int
) -> dict[str, float] | None:
    """Where the realized gain came from and went: Σ over the questions both settings ran of
    pipelined − blocking, per PART of each one's own critical path, and the decode part per
    layer (`decode_layer_<n>`). Overlap shows as negative exposed_prefill; slower decoding as
    positive decode (warm-ups beside it, 1-7% of their time on the CPU VM per
    router/decode_slowdown.py, or the machine's own drift: experiments/speed_reference.py)."""
    by = {(r.sample_id, r.setting): r for r in rows if r.ok}
    sums: dict[str, float] = {}
    for (sid, s), piped in by.items():
        base = by.get((sid, blocking))
        if s != pipelined or base is None:
            continue
        parts = [(breakdown(r), decode_by_layer(r)) for r in (piped, base)]
        if any(p is None or d is None for p, d in parts):
            continue
        for sign, (p, d) in zip((1.0, -1.0), parts):
            for k, v in p.items():
                sums[k] = sums.get(k, 0.0) + sign * v
            for layer, v in d.items():
                key = f"decode_layer_{layer}"
                sums[key] = sums.get(key, 0.0) + sign * v
    return sums or None


def median_breakdown(rows: Sequence[ResultRow]) -> dict[str, float] | None:
    """Per PART, the median over rows of its seconds on the critical path."""
    parts = [b for r in rows if r.ok and (b := breakdown(r)) is not None]
    if not parts:
        return None
    return {k: float(np.median([p[k] for p in parts])) for k in PARTS}
