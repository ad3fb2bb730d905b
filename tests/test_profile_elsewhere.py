"""A profile says where it was measured; `simulate`, `plan` and `validate` warn when it is
applied to a machine it does not describe (profiling/machine.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from profiling.machine import device_info, profile_warning, versions
from profiling.profile_file import Profile
from simulation import validate
from tests.text_checks import said

DATA = Path(__file__).parent / "data" / "simulation"


def here(profile: Profile) -> Profile:
    """`profile` as if measured on this machine with this machine's packages."""
    return profile.model_copy(update={"device": device_info(cuda=False), "versions": versions()})


def test_a_cpu_profile_of_another_cpu_or_package_version_is_flagged():
    ours = here(Profile.load(DATA / "profile_cpu.json"))
    assert profile_warning(ours, "p.json") is None
    other_cpu = ours.model_copy(
        update={"device": ours.device.model_copy(update={"name": "Imaginary CPU 9000"})}
    )
    warning = profile_warning(other_cpu, "p.json")
    assert "Imaginary CPU 9000" in warning and "moa-pd profile" in warning
    more_cores = ours.model_copy(update={"device": ours.device.model_copy(update={"cores": 64})})
    assert "64 cores" in profile_warning(more_cores, "p.json")
    old_torch = ours.model_copy(update={"versions": {**ours.versions, "torch": "1.0.0"}})
    assert "torch 1.0.0" in profile_warning(old_torch, "p.json")


def test_a_gpu_profile_planned_from_a_machine_without_gpus_is_not_flagged(monkeypatch):
    from tests.anchor_profile import anchor_profile

    monkeypatch.setattr("shutil.which", lambda name: None)  # no nvidia-smi here
    assert profile_warning(anchor_profile(), "anchor.json") is None


def test_validate_warns_on_stderr_and_still_validates(tmp_path, capsys):
    profile = Profile.load(DATA / "profile_cpu.json")
    other = profile.model_copy(
        update={"device": profile.device.model_copy(update={"name": "Imaginary CPU 9000"})}
    )
    path = tmp_path / "profile.json"
    other.dump(path)
    args = argparse.Namespace(
        profile=[str(path)], runs=[str(DATA / "tree_c1")], concurrency=None, gate_by_slots=True
    )
    validate.main(args)
    out, err = capsys.readouterr()
    assert "may not fit this machine" in said(err) and "Imaginary CPU 9000" in said(err)
    assert "Simulator vs measured" in out
