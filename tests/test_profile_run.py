"""`moa-pd profile` end to end on the reference engine: a 2-layer Qwen3 shape in a PD pair,
tiny lengths; the profile has every point asked for, sane fits, and round-trips."""

from __future__ import annotations

import pytest
from test_profile_units import _assert_sane

from launch.cli import main
from profiling.profile_file import Profile

pytestmark = [pytest.mark.slow, pytest.mark.deployment]


def test_profile_of_a_tiny_model_on_the_reference_engine(tmp_path, capsys):
    out = tmp_path / "profile.json"
    argv = ["profile", "--config", "tree_3_1_dummy_cpu", "--out", str(out)]
    argv += ["--run-dir", str(tmp_path / "run"), "--reps", "2"]
    argv += ["--prompt-lengths", "16,64", "--cached-prefixes", "32", "--cached-new-tokens", "16"]
    argv += ["--decode-batches", "1,3", "--decode-contexts", "16,48", "--decode-tokens", "24"]
    assert main(argv) == 0
    assert "qwen3-tiny" in capsys.readouterr().out  # the summary table
    profile = Profile.load(out)
    assert profile.backend == "torch" and profile.device.kind == "cpu"
    assert {"moa-pd", "torch", "transformers"} <= set(profile.versions)
    m = profile.models["qwen3-tiny"]
    assert m.model_path == "dummy:qwen3-tiny"
    cold = sorted(p.new_tokens for p in m.prefill if p.cached_tokens == 0)
    assert cold == [16, 64]
    cached = [p for p in m.prefill if p.cached_tokens]
    assert len(cached) == 1 and cached[0].cached_tokens >= 16
    # Each (batch, context) once; a point's context is the prompt plus half its output.
    assert sorted(d.batch for d in m.decode) == [1, 1, 3, 3]
    assert sorted(d.context for d in m.decode)[::2] >= [16 + 6, 16 + 6]
    assert max(d.context for d in m.decode) >= 48 + 6
    assert all(p.seconds > 0 for p in m.prefill) and all(d.step_seconds > 0 for d in m.decode)
    _assert_sane(profile)
