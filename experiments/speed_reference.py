"""How much the machine's own speed moved between the two runs of a question that a paired
benchmark compares, read from work both runs did identically.

At concurrency 1 a question's final agent decodes alone (every other agent has ended) and, under
greedy decoding, the same tokens from the same prompt in the blocking and the pipelined setting:
the time its decode takes in each run is the same work timed twice. Their ratio is the machine's
drift between the two runs, measured on the model itself rather than on a probe beside it. On the
project's 2-core cloud VM it moved by up to 1.94× within a question pair (docs/benchmarks.md), so
a paired ratio comes with this one beside it, and pairs where the machine moved more than
STEADY_BAND can be told apart from pairs where the settings differed.

Only meaningful where the final agent ran alone: rows of a concurrency-1 run.
"""

from __future__ import annotations

from collections.abc import Sequence

from experiments.critical_path import final_agent
from experiments.results import ResultRow

# A pair whose final decode took within ±10% in both runs counts as run on a steady machine.
STEADY_BAND = 0.10


def final_decode_s(row: ResultRow) -> float | None:
    """The final agent's decode time (first token to end, the shell router's clock); None when
    the row failed or its trace lacks the times."""
    final = final_agent(row) if row.ok else None
    if final is None:
        return None
    a = row.agents[final]
    if a.first_token_s is None or a.end_s is None or a.end_s <= a.first_token_s:
        return None
    return a.end_s - a.first_token_s


def speed_ratios(rows: Sequence[ResultRow], setting: int, reference: int) -> dict[str, float]:
    """Per question both settings ran with the same final tokens: final decode time of
    `setting` ÷ that of `reference` (above 1: the machine was slower in `setting`'s run)."""
    by = {(r.sample_id, r.setting): r for r in rows if r.ok}
    out = {}
    for (sid, s), row in by.items():
        ref = by.get((sid, reference))
        if s != setting or ref is None:
            continue
        final = final_agent(ref)
        if final is None or row.agents.get(final) is None:
            continue
        if row.agents[final].output_ids != ref.agents[final].output_ids:
            continue  # not the same work
        mine, theirs = final_decode_s(row), final_decode_s(ref)
        if mine is not None and theirs is not None:
            out[sid] = mine / theirs
    return out


def steady(ratios: dict[str, float], band: float = STEADY_BAND) -> set[str]:
    """The questions whose two runs saw the machine at the same speed, within `band`."""
    return {sid for sid, x in ratios.items() if abs(x - 1.0) <= band}
