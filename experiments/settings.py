"""The paper's four settings (§5.3): which topology, which router mode, early exit or not; #5,
the single-model baseline (each model of the tree config alone, experiments/single_model.py);
#6, routed (issue 20): the routed config (a pool and a router, routing/) pipelined with early
exit as in #4, each question running only the proposers its router chose; and #7, the tree in the paper's own blocking baseline: layer by layer, every agent of a layer
waits for the whole previous layer (#2 starts each successor once its own precursors ended, a
stronger baseline). On a dense all-to-all topology the two blocking modes are the same.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Setting:
    number: int
    label: str
    # "dense", "tree", "routed" (the --routed-config) or "single" (each model of the tree alone)
    topology: str
    mode: str  # the shell router's mode: "blocking", "blocking_layer" or "pipelined"
    early_exit: bool


SETTINGS = {
    1: Setting(1, "#1 dense, blocking", "dense", "blocking", False),
    2: Setting(2, "#2 tree, blocking", "tree", "blocking", False),
    3: Setting(3, "#3 tree, pipelined", "tree", "pipelined", False),
    4: Setting(4, "#4 tree, pipelined + EE", "tree", "pipelined", True),
    5: Setting(5, "#5 single model", "single", "blocking", False),
    6: Setting(6, "#6 tree + routing, pipelined + EE", "routed", "pipelined", True),
    7: Setting(7, "#7 tree, blocking by layer", "tree", "blocking_layer", False),
}
SINGLE = 5
CHOICES = "numbers among " + ", ".join(map(str, SETTINGS))


def parse_settings(text: str) -> list[Setting]:
    """'1,2,3,4' -> settings; a clear error for anything else."""
    try:
        numbers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--settings takes {CHOICES} separated by commas, got '{text}'") from None
    bad = [n for n in numbers if n not in SETTINGS]
    if bad or not numbers:
        raise ValueError(f"--settings takes {CHOICES} separated by commas, got '{text}'")
    return [SETTINGS[n] for n in dict.fromkeys(numbers)]
