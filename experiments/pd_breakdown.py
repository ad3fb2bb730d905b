"""Where a PD request's time to first token goes, from the workers' own meta_info timings (SGLang's
names, `--enable-metrics`; the reference engine reports the same). Called by summary.py (the
median per part of the critical path), timeline.py (each request's prefill bar split) and
benchmarks/ttft_summary.py (the TTFT benchmark's median per part).

A request's TTFT, from the router sending it (`final_request_s`) to its first token arriving
(`first_token_s`), is cut at five points the workers report, each in the session's seconds:
prefill's waiting-queue entry (forward_entry_time - queue_time: bootstrap done), prefill's first
forward (forward_entry_time), the end of its prompt's forward (prefill_finished_time), decode's
waiting-queue entry (its forward_entry_time - queue_time: the KV arrived) and decode sending
its first chunk (response_sent_to_client_ts). So:
- `bootstrap`: the way to the prefill worker and its bootstrap queue (the decode peer's
  handshake and pre-allocation);
- `prefill_queue`: prefill's waiting queue (its `queue_time`);
- `prefill_compute`: the prompt's forward passes, chunked prefill included;
- `kv_transfer`: the end of prefill until the KV reached decode;
- `first_decode_step`: decode's wait for a batch and the step that emits the first token
  (SGLang's prebuilt batch), until its API server sends it;
- `to_router`: the token's way from the decode worker's API server to the shell router.
The rest of decoding (first token to end) is the critical path's `decode` part.

A part whose ends are not both known is None ("unknown"), never estimated: a request sent through
a native sglang-router (runs before the shell router dispatched leaves itself) has decode's reply
only, so its prefill-side parts are unknown; without `--enable-metrics` every part is. `unattributed` is the TTFT the unknown parts cover.
SGLang 0.5.17 and 0.5.23 report every one of these keys (scheduler: forward_entry_time,
prefill_finished_time, queue_time in every chunk; API server: request_received_ts,
response_sent_to_client_ts, request_finished_ts in the last), and so does the reference engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from experiments.critical_path import critical_path, final_agent
from experiments.results import AgentTrace, ResultRow
from sglang_ext import protocol as P

COMPONENTS = (
    "bootstrap",
    "prefill_queue",
    "prefill_compute",
    "kv_transfer",
    "first_decode_step",
    "to_router",
)
UNATTRIBUTED = "unattributed"
UNKNOWN = "unknown"
# The critical path's requests, as critical_path.PARTS names their prefill.
KINDS = ("leaf_prefill", "exposed_prefill")


def _queue_entry(timing: dict[str, float], side: str) -> float | None:
    """Unix time `side`'s request entered its waiting queue: forward entry less queue time."""
    forward, queue = (
        timing.get(f"{side}.{P.FORWARD_ENTRY_TIME}"),
        timing.get(f"{side}.{P.QUEUE_TIME}"),
    )
    return None if forward is None or queue is None else forward - queue


def boundaries(agent: AgentTrace, session_started_at: float | None) -> list[float | None]:
    """The seven cut points of the agent's (final) request in session seconds, None where
    unknown: sent, prefill queued, prefill forward, prefill finished, KV at decode, first token
    on decode, first token at the router."""
    t = agent.worker_timing
    unix = [
        _queue_entry(t, "prefill"),
        t.get(f"prefill.{P.FORWARD_ENTRY_TIME}"),
        t.get(f"prefill.{P.PREFILL_FINISHED_TIME}"),
        _queue_entry(t, "decode"),
        t.get(f"decode.{P.RESPONSE_SENT_TO_CLIENT_TS}"),
    ]
    inner = [
        None if u is None or session_started_at is None else u - session_started_at for u in unix
    ]
    return [agent.final_request_s, *inner, agent.first_token_s]


def request_breakdown(
    agent: AgentTrace, session_started_at: float | None
) -> dict[str, float | None] | None:
    """Seconds of each COMPONENT of the agent's request (None: unknown), `ttft`, and the
    `unattributed` TTFT; None when the request never got its first token."""
    b = boundaries(agent, session_started_at)
    if b[0] is None or b[-1] is None:
        return None
    parts: dict[str, float | None] = {
        name: (b[i + 1] - b[i] if b[i] is not None and b[i + 1] is not None else None)
        for i, name in enumerate(COMPONENTS)
    }
    ttft = b[-1] - b[0]
    parts["ttft"] = ttft
    parts[UNATTRIBUTED] = ttft - sum(parts[k] for k in COMPONENTS if parts[k] is not None)
    return parts


def path_breakdown(row: ResultRow) -> dict[str, dict[str, float | None]] | None:
    """Per KIND, each component summed over that kind's requests on the row's critical path
    (None when any of them lacks it); None when the trace lacks the times."""
    final = final_agent(row)
    if final is None:
        return None
    out: dict[str, dict[str, float | None]] = {}
    for agent_id in critical_path(row.agents, final):
        a = row.agents[agent_id]
        parts = request_breakdown(a, row.session_started_at)
        if parts is None:
            return None
        kind = KINDS[1] if a.slot_order else KINDS[0]
        if kind not in out:
            out[kind] = parts
            continue
        acc = out[kind]
        for k, v in parts.items():
            acc[k] = None if acc[k] is None or v is None else acc[k] + v
    return out


def median_path_breakdown(rows: Sequence[ResultRow]) -> dict[str, dict] | None:
    """Per KIND and component, the median of its seconds on the critical path over the rows that
    know it, or "unknown" where none does; `rows` counts the rows with requests of that kind."""
    per_row = [b for r in rows if r.ok and (b := path_breakdown(r)) is not None]
    out: dict[str, dict] = {}
    for kind in KINDS:
        mine = [b[kind] for b in per_row if kind in b]
        if mine:
            out[kind] = {"rows": len(mine), **median_parts(mine)}
    return out or None


def median_parts(breakdowns: Sequence[dict[str, float | None]]) -> dict[str, float | str]:
    """Per component (and `ttft`, `unattributed`), the median seconds over the breakdowns that
    know it, or "unknown" where none does."""
    out: dict[str, float | str] = {}
    for k in (*COMPONENTS, "ttft", UNATTRIBUTED):
        known = [b[k] for b in breakdowns if b.get(k) is not None]
        out[k] = float(np.median(known)) if known else UNKNOWN
    return out
