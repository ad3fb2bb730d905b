"""A model's measured costs on one machine (`moa-pd profile`), as written to profile.json, and the
cost functions the simulator and the planner read from it.

The cost functions are least-squares fits of the measured points to the shapes that serving
engines' costs take (Vidur and DistServe use the same decomposition): a prefill costs a fixed part,
a part per new token and a part per key a new token's attention reads (causal: the cached prefix
and the new tokens before it, n·(cached + n/2) in all, the same however the prompt is chunked); a
decode step costs a fixed part (weights read once per step), a part per sequence in the batch and
a part per token of context summed over the batch (KV read); the PD path (TTFT minus the
prefill) costs a fixed part (bootstrap, hops) and the prompt's KV bytes over the transfer's
bandwidth. Fits, not interpolation tables, so a profile measured on a few points extrapolates
sanely to the lengths a topology produces.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "moa-pd.profile/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceInfo(_Strict):
    kind: Literal["cpu", "cuda"]
    name: str  # "NVIDIA H200", or the CPU model name
    count: int = 1  # GPUs (or cores) the profiled workers could use
    memory_mib: int | None = None  # per GPU; None on CPU
    cores: int | None = None  # CPU cores of the machine
    # How busy workers on the CPU slow each other beyond sharing its cores (profiling/co_run.py,
    # `moa-pd profile --co-run`): None where not measured (the simulator then assumes none).
    co_run_slowdown: float | None = None
    oversubscribed_slowdown: float | None = None


class PrefillPoint(_Strict):
    new_tokens: int  # tokens computed
    cached_tokens: int = 0  # tokens of the prompt already in the radix cache
    seconds: float  # median prefill compute time (no queueing, no PD hops)


class DecodePoint(_Strict):
    batch: int  # sequences decoding together
    context: int  # tokens of context per sequence (prompt + generated so far)
    step_seconds: float  # median time of one decode step of the whole batch


class PDPoint(_Strict):
    prompt_tokens: int
    seconds: float  # median TTFT over the PD path minus the cold prefill at this length


class ModelProfile(_Strict):
    model_path: str
    weights_bytes: int
    kv_bytes_per_token: int
    prefill: list[PrefillPoint] = Field(min_length=2)
    decode: list[DecodePoint] = Field(min_length=2)
    pd_fixed_seconds: float  # TTFT through the PD path minus prefill: bootstrap, KV, hops
    # The same per prompt length. With two lengths or more the PD path is fitted as a fixed part
    # plus the prompt's KV bytes over a bandwidth (`pd_seconds`); without (older profiles, the
    # GPU anchors) it is pd_fixed_seconds at every length.
    pd: list[PDPoint] = Field(default_factory=list)
    notes: str = ""

    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached_property,))

    @cached_property
    def _prefill_coef(self) -> np.ndarray:
        x = np.array(
            [[1.0, p.new_tokens, _keys_read(p.new_tokens, p.cached_tokens)] for p in self.prefill]
        )
        return _nonnegative_fit(x, np.array([p.seconds for p in self.prefill]))

    @cached_property
    def _decode_coef(self) -> np.ndarray:
        x = np.array([[1.0, d.batch, d.batch * d.context] for d in self.decode])
        return _nonnegative_fit(x, np.array([d.step_seconds for d in self.decode]))

    @cached_property
    def _pd_coef(self) -> np.ndarray | None:
        if len({p.prompt_tokens for p in self.pd}) < 2:
            return None
        x = np.array([[1.0, p.prompt_tokens * self.kv_bytes_per_token] for p in self.pd])
        coef = _nonnegative_fit(x, np.array([p.seconds for p in self.pd]))
        return coef if coef[1] > 0 else None  # no cost that grows with length: all fixed

    @property
    def kv_transfer_bytes_per_second(self) -> float | None:
        """The measured bandwidth of the prompt's KV from prefill to decode (None: not
        separable from the fixed part, which then holds it)."""
        return None if self._pd_coef is None else float(1.0 / self._pd_coef[1])

    def pd_seconds(self, prompt_tokens: int) -> float:
        """Predicted PD-path time of a request (bootstrap, hops and the KV transfer of its
        whole prompt, cached prefix included), beside its prefill compute."""
        if self._pd_coef is None:
            return self.pd_fixed_seconds
        a, per_byte = self._pd_coef
        return float(a + per_byte * prompt_tokens * self.kv_bytes_per_token)

    def prefill_seconds(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Predicted compute time of a prefill of `new_tokens` after `cached_tokens` cached."""
        a, b, c = self._prefill_coef
        return float(a + b * new_tokens + c * _keys_read(new_tokens, cached_tokens))

    def decode_step_seconds(self, batch: int, mean_context: float) -> float:
        """Predicted time of one decode step for `batch` sequences of `mean_context` tokens."""
        if batch <= 0:
            return 0.0
        a, b, c = self._decode_coef
        return float(a + b * batch + c * batch * mean_context)


class Profile(_Strict):
    """Every profiled model of one machine and backend."""

    schema_: Literal["moa-pd.profile/1"] = Field(SCHEMA, alias="schema")
    device: DeviceInfo
    backend: Literal["torch", "sglang"]
    versions: dict[str, str]  # package -> version: moa_pd, torch, sglang, ...
    created: str  # ISO 8601, UTC
    host: str = ""
    models: dict[str, ModelProfile]  # the config's model name -> its costs

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.model_validate_json(Path(path).read_text())

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(by_alias=True, indent=2) + "\n")

    @classmethod
    def pooled(cls, profiles: Sequence[Profile]) -> Profile:
        """One profile from several of one machine, backend and models measured at different
        moments: each model's points from all of them, so each fit passes through their mean
        where they measured the same points; the co-run terms and the fixed PD time averaged.

        Why: a cloud VM's speed moves within the hour a set of runs takes (docs/benchmarks.md,
        stops 40-41), so one profile predicts them from one moment of it; several average it
        out. How far that gets is measured, not assumed: on stop 41's runs, profiles taken just
        before and just after them, pooled, still left 9 of 16 validation checks outside ±10%,
        since the VM was slower in between than at either end. Raises ValueError naming what
        differs."""
        if not profiles:
            raise ValueError("no profile to pool")
        first = profiles[0]
        if len(profiles) == 1:
            return first
        for other in profiles[1:]:
            why = _unpoolable(first, other)
            if why:
                raise ValueError(f"cannot pool profiles of different setups: {why}")
        # Built from plain data, not model_copy: a copy would carry the cached fits along.
        data = first.model_dump(by_alias=True)
        for name, m in data["models"].items():
            own = [pr.models[name] for pr in profiles]
            m["prefill"] = [p.model_dump() for o in own for p in o.prefill]
            m["decode"] = [d.model_dump() for o in own for d in o.decode]
            m["pd"] = [p.model_dump() for o in own for p in o.pd]
            m["pd_fixed_seconds"] = float(np.mean([o.pd_fixed_seconds for o in own]))
        for term in ("co_run_slowdown", "oversubscribed_slowdown"):
            data["device"][term] = _mean_measured([getattr(p.device, term) for p in profiles])
        data["created"] = " + ".join(p.created for p in profiles)
        return cls.model_validate(data)


def read_profiles(paths: Sequence[str | Path]) -> list[Profile]:
    """The profiles at `paths`. Raises OSError or ValueError naming the file that could not be
    read."""
    profiles = []
    for path in paths:
        try:
            profiles.append(Profile.load(path))
        except OSError as e:
            raise OSError(f"profile {path}: {e.strerror or e}") from None
        except ValueError as e:  # pydantic's ValidationError, bad JSON included
            raise ValueError(f"profile {path} is no profile.json: {e}") from None
    return profiles


def load_profiles(paths: Sequence[str | Path]) -> Profile:
    """The profile at one path, or the pool of several (`Profile.pooled`)."""
    return Profile.pooled(read_profiles(paths))


def decode_drift(earlier: Profile, later: Profile) -> dict[str, float]:
    """Per model, the median ratio of `later`'s decode step to `earlier`'s at the points both
    measured (1.10: the machine decoded 10% slower when `later` was taken); models without a
    common point are left out."""
    out = {}
    for name, m in earlier.models.items():
        if name not in later.models:
            continue
        before = {(d.batch, d.context): d.step_seconds for d in m.decode}
        ratios = [
            d.step_seconds / before[(d.batch, d.context)]
            for d in later.models[name].decode
            if (d.batch, d.context) in before
        ]
        if ratios:
            out[name] = float(np.median(ratios))
    return out


def _unpoolable(a: Profile, b: Profile) -> str | None:
    if a.backend != b.backend:
        return f"backend {a.backend} vs {b.backend}"
    da, db = a.device, b.device
    if (da.kind, da.name, da.count, da.cores) != (db.kind, db.name, db.count, db.cores):
        return (
            f"device {da.name} ({da.count} of {da.cores}) vs {db.name} ({db.count} of {db.cores})"
        )
    if set(a.models) != set(b.models):
        return f"models {sorted(a.models)} vs {sorted(b.models)}"
    for name, m in a.models.items():
        o = b.models[name]
        if (m.model_path, m.kv_bytes_per_token) != (o.model_path, o.kv_bytes_per_token):
            return f"model {name}: {m.model_path} vs {o.model_path}"
    package = "torch" if a.backend == "torch" else "sglang"
    va, vb = a.versions.get(package), b.versions.get(package)
    if va != vb:
        return f"{package} {va} vs {vb}"
    return None


def _mean_measured(values: list[float | None]) -> float | None:
    measured = [v for v in values if v is not None]
    return float(np.mean(measured)) if measured else None


def _keys_read(new_tokens: float, cached_tokens: float) -> float:
    """Keys a prefill's attention reads: each new token attends to the cached prefix and to the
    new tokens up to itself. Without the second part a line through short cold prompts
    under-predicts a 1,024-token one by ~15% (its attention is quadratic; profile.json points of
    SmolLM2 and Gemma-3 on this CPU: largest fit error 17% and 27% without it, 6% and 2% with)."""
    return new_tokens * (cached_tokens + new_tokens / 2)


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a cost never falls as work grows)."""
    from scipy.optimize import nnls

    coef, _ = nnls(x, y)
    return coef
