"""The `moa-pd sweep SPEC.json` file: its pydantic schema, loading with errors that name the JSON
path, and the chunk-policy override written into a copy of a topology config."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from experiments.settings import CHOICES, SETTINGS
from router.config_loader import (
    config_from_dict,
    parse_json,
    read_json_file,
    resolve_config_path,
    validate_object,
)


class SweepSpec(BaseModel):
    """configs × datasets × chunk_policies runs, each running `settings` on the same questions.

    A chunk policy is "config" (as the config says), "adaptive", or "fixed:N" (N-token chunks).
    """

    model_config = ConfigDict(extra="forbid")

    configs: list[str] = Field(min_length=1, description="tree configs (settings 2-4)")
    dense_config: str | None = Field(None, description="all-to-all config for setting 1")
    routed_config: str | None = Field(None, description="pool + routing config for setting 6")
    datasets: list[str] = Field(min_length=1)
    settings: list[int] = [1, 2, 3, 4]
    chunk_policies: list[str] = ["config"]
    num_samples: int | None = Field(None, gt=0)
    concurrency: int = Field(1, gt=0)
    out: str
    backend: Literal["torch", "sglang"] = "torch"
    cluster: str | None = Field(None, description="an existing deployment's cluster.json")

    @field_validator("settings")
    @classmethod
    def _settings(cls, v: list[int]) -> list[int]:
        bad = [s for s in v if s not in SETTINGS]
        if bad or not v:
            raise ValueError(
                f"settings are {CHOICES} (paper settings #1-#4, #5 single model, #6 routed, "
                f"#7 tree blocking by layer), got {v}"
            )
        return list(dict.fromkeys(v))

    @field_validator("chunk_policies")
    @classmethod
    def _policies(cls, v: list[str]) -> list[str]:
        for p in v:
            parse_chunk_policy(p)
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        if 1 in self.settings and not self.dense_config:
            raise ValueError(
                "setting 1 (dense all-to-all) needs 'dense_config'; add it or drop "
                "1 from 'settings'"
            )
        if 6 in self.settings and not self.routed_config:
            raise ValueError(
                "setting 6 (routed) needs 'routed_config'; add it or drop 6 from 'settings'"
            )
        if self.cluster and self.chunk_policies != ["config"]:
            raise ValueError(
                "'chunk_policies' rewrites configs, which needs a fresh deployment "
                "per run; drop 'cluster' or leave 'chunk_policies' out"
            )
        return self


def parse_chunk_policy(text: str) -> tuple[str, int | None] | None:
    """ "config" -> None; "adaptive" -> ("adaptive", None); "fixed:64" -> ("fixed", 64)."""
    if text == "config":
        return None
    if text == "adaptive":
        return ("adaptive", None)
    m = re.fullmatch(r"fixed:(\d+)", text)
    if m and int(m.group(1)) > 0:
        return ("fixed", int(m.group(1)))
    raise ValueError(
        f"chunk policy {text!r} is not one of 'config', 'adaptive', 'fixed:N' (N > 0 tokens)"
    )


def load_spec(path: str | Path) -> SweepSpec:
    return spec_from_dict(parse_json(read_json_file(path, "the sweep spec"), str(path)), str(path))


def spec_from_dict(raw: object, source: str = "<sweep spec>") -> SweepSpec:
    return validate_object(raw, SweepSpec, source, "a sweep spec")


def config_with_chunk_policy(config: str, policy: str, out_dir: Path) -> str:
    """The config path a run should use: as given for "config", else a validated copy with
    incremental_prefill's chunk policy replaced, saved under OUT_DIR/configs with the same file
    name (so the config keeps its name for the router)."""
    parsed = parse_chunk_policy(policy)
    if parsed is None:
        return config
    src = resolve_config_path(config)
    raw = json.loads(src.read_text(encoding="utf-8"))
    inc = dict(raw.get("incremental_prefill") or {})
    inc["chunk_policy"], tokens = parsed
    if tokens is not None:
        inc["chunk_tokens"] = tokens
    raw["incremental_prefill"] = inc
    config_from_dict(raw, f"{src} with chunk policy {policy}")
    dest = out_dir / "configs" / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    return str(dest)
