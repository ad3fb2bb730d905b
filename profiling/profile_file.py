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
