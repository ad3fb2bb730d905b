"""Profiles taken around some runs, pooled (`Profile.pooled`): what the simulator's validation
uses, since a VM's speed drifts within the half hour the runs take."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from profiling.profile_file import Profile, decode_drift, load_profiles
from simulation import validate

DATA = Path(__file__).parent / "data" / "simulation"


def slower(profile: Profile, factor: float, **device) -> Profile:
    """The same profile measured on a machine `factor` times slower (every timing scaled)."""
    data = profile.model_dump(by_alias=True)
    for m in data["models"].values():
        for p in m["prefill"] + m["pd"]:
            p["seconds"] *= factor
        for d in m["decode"]:
            d["step_seconds"] *= factor
        m["pd_fixed_seconds"] *= factor
    data["device"].update(device)
    data["created"] = "2026-11-29T10:00:00+00:00"
    return Profile.model_validate(data)


@pytest.fixture(scope="module")
def before() -> Profile:
    return Profile.load(DATA / "profile_cpu.json")


def test_the_pool_predicts_the_mean_of_the_profiles(before):
    after = slower(before, 1.2, co_run_slowdown=0.5)
    pooled = Profile.pooled([before, after])
    for name in before.models:
        a, b, p = before.models[name], after.models[name], pooled.models[name]
        assert len(p.decode) == len(a.decode) + len(b.decode)
        # Every timing scaled by 1.2: each fit scales by 1.2, and the pooled fit sits at the mean.
        for batch, context in ((1, 100), (8, 500), (16, 1000)):
            want = (
                a.decode_step_seconds(batch, context) + b.decode_step_seconds(batch, context)
            ) / 2
            assert p.decode_step_seconds(batch, context) == pytest.approx(want, rel=1e-6)
        want = (a.prefill_seconds(300, 200) + b.prefill_seconds(300, 200)) / 2
        assert p.prefill_seconds(300, 200) == pytest.approx(want, rel=1e-6)
        assert p.pd_fixed_seconds == pytest.approx(a.pd_fixed_seconds * 1.1)
    assert pooled.device.co_run_slowdown == pytest.approx((before.device.co_run_slowdown + 0.5) / 2)
    assert pooled.created == f"{before.created} + {after.created}"
    assert decode_drift(before, after) == pytest.approx(dict.fromkeys(before.models, 1.2))
    assert Profile.pooled([before]) is before


def test_a_co_run_term_measured_in_one_profile_only_is_kept(before):
    unmeasured = slower(before, 1.0, co_run_slowdown=None, oversubscribed_slowdown=None)
    pooled = Profile.pooled([unmeasured, before])
    assert pooled.device.co_run_slowdown == before.device.co_run_slowdown
    assert pooled.device.oversubscribed_slowdown == before.device.oversubscribed_slowdown


def test_profiles_of_different_setups_are_not_pooled(before):
    with pytest.raises(ValueError, match="Imaginary CPU"):
        Profile.pooled([before, slower(before, 1.0, name="Imaginary CPU")])
    with pytest.raises(ValueError, match="models"):
        Profile.pooled([before, before.model_copy(update={"models": {}})])
    other_torch = before.model_copy(update={"versions": {**before.versions, "torch": "1.0"}})
    with pytest.raises(ValueError, match="torch"):
        Profile.pooled([before, other_torch])
    with pytest.raises(ValueError, match="no profile"):
        Profile.pooled([])


def test_a_bad_profile_path_is_named(tmp_path):
    with pytest.raises(OSError, match="missing.json"):
        load_profiles([DATA / "profile_cpu.json", tmp_path / "missing.json"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "moa-pd.profile/1"}))
    with pytest.raises(ValueError, match="bad.json is no profile.json"):
        load_profiles([bad])


def test_validate_pools_the_profiles_and_prints_the_drift(before, tmp_path, capsys):
    after = tmp_path / "after.json"
    slower(before, 1.1).dump(after)
    args = argparse.Namespace(
        profile=[str(DATA / "profile_cpu.json"), str(after)],
        runs=[str(DATA / "tree_c1")],
        concurrency=None,
        gate_by_slots=True,  # stop 39's runs: the slots-only gate
    )
    validate.main(args)
    out = capsys.readouterr().out
    assert "2 profiles pooled" in out
    assert "smollm2 +10.0%" in out
    assert "Simulator vs measured" in out
