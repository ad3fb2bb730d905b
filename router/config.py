"""Topology configs (`cfgs/*.json`): the pydantic schema and everything that can be checked
before a process starts.

Callers: `moa-pd validate/show`, the launcher, the shell router and the experiment runner all load
configs through `load_config`, so a bad file fails the same way everywhere.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sglang_ext import protocol as P

# An agent's dependencies are exactly the slots in its template.
SLOT_PATTERN = re.compile(r"<\|answer:([^|<>]+)\|>")
QUESTION_FIELD = "{question}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sampling(_Strict):
    """SGLang's sampling_params, by SGLang's names. Unset fields fall back to the config default."""

    max_new_tokens: int | None = Field(default=None, gt=0, le=65536)
    # With ignore_eos, max_new_tokens fixes an answer's length exactly (weight-free benchmarks).
    min_new_tokens: int | None = Field(default=None, ge=0, le=65536)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    sampling_seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None

    @model_validator(mode="after")
    def _min_below_max(self) -> Sampling:
        lo, hi = self.min_new_tokens, self.max_new_tokens
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_new_tokens ({lo}) exceeds max_new_tokens ({hi}); lower it")
        return self

    def merged_over(self, base: Sampling) -> Sampling:
        """This agent's values, with the config-wide defaults where it sets none."""
        return base.model_copy(update=self.model_dump(exclude_none=True))

    def to_sglang(self) -> dict:
        """The `sampling_params` dict SGLang accepts (only keys that are set)."""
        return self.model_dump(exclude_none=True)


class Workers(_Strict):
    prefill: int = Field(default=1, ge=1)
    decode: int = Field(default=1, ge=1)


class ModelSpec(_Strict):
    """One served model: a PD deployment of `workers.prefill` + `workers.decode` workers."""

    model_path: str = Field(
        description="local path, HF id, 'smollm2-135m' (the embedded model), or 'dummy:SHAPE' "
        "(a shape-only model, e.g. 'dummy:qwen3-8b', served with random weights)"
    )
    tokenizer_path: str | None = None
    # SGLang's --load-format: "dummy" serves random weights of the model's real shape (no
    # weights read; timings real, outputs not), on both backends. Default: "dummy" for a
    # 'dummy:SHAPE' model_path, else "auto".
    load_format: Literal["auto", "dummy"] = "auto"
    workers: Workers = Workers()
    # Extra server flags per backend, by SGLang's flag names without dashes, e.g.
    # {"sglang": {"mem_fraction_static": 0.8}, "torch": {"max_total_tokens": 8192}}.
    server_args: dict[Literal["torch", "sglang"], dict[str, str | int | float | bool]] = {}

    @property
    def is_shape_only(self) -> bool:
        """A 'dummy:SHAPE' model: a directory the model store writes, with no weights."""
        return P.dummy_shape(self.model_path) is not None

    @model_validator(mode="before")
    @classmethod
    def _dummy_path_loads_dummy(cls, data):
        if isinstance(data, dict) and P.dummy_shape(str(data.get("model_path", ""))) is not None:
            return {"load_format": P.LOAD_FORMAT_DUMMY, **data}
        return data

    @model_validator(mode="after")
    def _check_load_format(self) -> ModelSpec:
        if self.is_shape_only and self.load_format != P.LOAD_FORMAT_DUMMY:
            raise ValueError(
                f"model_path '{self.model_path}' has no weights: drop load_format "
                '(it defaults to "dummy" there) or set it to "dummy"'
            )
        if P.dummy_shape(self.model_path) == "":
            raise ValueError("model_path 'dummy:' names no shape: write e.g. 'dummy:qwen3-8b'")
        for backend, args in self.server_args.items():
            if "load_format" in args:
                raise ValueError(
                    f"server_args.{backend}.load_format: set the model's own load_format "
                    '(e.g. "load_format": "dummy"), which both backends honour'
                )
        return self


class Template(_Strict):
    """A chat prompt. `user` holds `{question}` and `<|answer:AGENT_ID|>` slots."""

    user: str
    system: str | None = None

    @property
    def slots(self) -> list[str]:
        return SLOT_PATTERN.findall(self.user)


class Agent(_Strict):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    model: str
    template: str
    sampling: Sampling = Sampling()


class EarlyExit(_Strict):
    """Dynamic early exit inside each cluster (a successor's precursor set)."""

    enabled: bool = False
    method: Literal["q", "dmv"] = "q"
    tau: float = Field(default=0.7, gt=0.0, lt=1.0)
    # Q = (sqrt(C̄·B))^e with e = tau (the paper's algorithm box), 1 (its prose) or 1/tau.
    exponent: Literal["tau", "none", "inverse_tau"] = "tau"
    include_diagonal: bool = True
    min_completed: int = Field(default=2, ge=1)
    seed: int = 0
    embedding_model: str = "all-minilm-l6-v2"


class IncrementalPrefill(_Strict):
    enabled: bool = True
    # adaptive: at most one warm-up in flight; the next carries all that arrived meanwhile, once
    # at least `min_chunk_tokens` new tokens are ready. fixed: exactly `chunk_tokens` at a time.
    chunk_policy: Literal["adaptive", "fixed"] = "adaptive"
    chunk_tokens: int = Field(default=32, gt=0)
    # A warm-up costs a request's fixed overhead (HTTP, scheduling, one forward launch) and
    # holds the prefill worker for a forward that a critical request may then wait behind; below
    # this many new tokens that cost buys too little. It also bounds the un-warmed tail the final
    # request pays for, so it trades warm-ups per successor against exposed prefill.
    min_chunk_tokens: int = Field(default=32, gt=0)


class AggregatorBypass(_Strict):
    """Skip a successor when its cluster agrees (MOSAIC's adaptive aggregation)."""

    enabled: bool = False
    criterion: Literal["answer", "q"] = "answer"
    q_threshold: float = Field(default=0.9, gt=0.0, le=1.0)


class TopologyConfig(_Strict):
    name: str
    description: str = ""
    models: dict[str, ModelSpec]
    templates: dict[str, Template]
    agents: list[Agent]
    sampling: Sampling = Sampling(max_new_tokens=256, temperature=0.0)
    final_agent: str | None = None
    early_exit: EarlyExit = EarlyExit()
    incremental_prefill: IncrementalPrefill = IncrementalPrefill()
    slot_order: Literal["template", "dynamic"] = "template"
    aggregator_bypass: AggregatorBypass = AggregatorBypass()

    @field_validator("agents")
    @classmethod
    def _not_empty(cls, agents: list[Agent]) -> list[Agent]:
        if not agents:
            raise ValueError("the agent list is empty; add at least one agent")
        return agents

    @model_validator(mode="after")
    def _check_graph(self) -> TopologyConfig:
        # Imported here: topology.py builds on this module's types.
        from router.topology import check_graph

        check_graph(self)
        return self

    # --- derived views ---------------------------------------------------------------------------
    def agent(self, agent_id: str) -> Agent:
        for a in self.agents:
            if a.id == agent_id:
                return a
        raise KeyError(agent_id)

    def template_of(self, agent_id: str) -> Template:
        return self.templates[self.agent(agent_id).template]

    def precursors(self, agent_id: str) -> list[str]:
        """The agents whose answers `agent_id` reads, in template order."""
        return self.template_of(agent_id).slots

    def sampling_of(self, agent_id: str) -> Sampling:
        return self.agent(agent_id).sampling.merged_over(self.sampling)

    @property
    def final(self) -> str:
        from router.topology import sinks

        return self.final_agent or sinks(self)[0]
