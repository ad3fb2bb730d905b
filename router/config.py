"""Topology configs (`cfgs/*.json`): the pydantic schema and everything that can be checked
before a process starts.

Callers: `moa-pd validate/show`, the launcher, the shell router and the experiment runner all load
configs through `load_config`, so a bad file fails the same way everywhere.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sglang_ext import protocol as P

# An agent's dependencies are exactly the slots in its template.
SLOT_PATTERN = re.compile(r"<\|answer:([^|<>]+)\|>")
QUESTION_FIELD = "{question}"
# A pool's variadic slot (see Pool) and the answer placeholder of its per-candidate item.
POOL_SLOT = "<|answers:pool|>"
POOL_ITEM_ANSWER = "<|answer|>"


def pool_template_name(candidate_id: str) -> str:
    """The template a pool candidate's agent reads (made by routing.pool_expansion)."""
    return f"pool.{candidate_id}"


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
    # A precursor that will stop at its max_new_tokens is the one end the router can foresee.
    # When the prompt waits on it alone, one last warm-up goes as it comes within one warm-up's
    # worth of tokens of that cap (its measured token rate × the last warm-up's time), whatever
    # min_chunk_tokens or chunk_tokens say, so the final request prefills only those tokens and
    # the template's tail instead of up to a chunk more (issue 28, item 4). Off by default: on
    # 20 questions at concurrency 1 it cut the final requests' own tokens by 18% and hid no more
    # of the critical path's prefill (what is left there is the PD handshake and the KV
    # transfer); its questions ran a median 1.024× those without it (docs/benchmarks.md).
    warm_before_cap: bool = False
    # The final request goes out the moment the prompt is complete, beside a warm-up still in
    # flight (whose KV it finds where that warm-up's forward ran first); false waits for that
    # warm-up's reply first, as before stop 49, for the ablation in bench_warmup_timing.
    final_beside_warmup: bool = True

    @staticmethod
    def cap_lead(rate_tok_s: float, warmup_s: float) -> int:
        """Tokens before a precursor's cap at which `warm_before_cap`'s last warm-up goes: what
        it streams at `rate_tok_s` during one warm-up of `warmup_s`, at least one. The router
        and the simulator both time it by this."""
        return max(1, math.ceil(rate_tok_s * warmup_s))


class AggregatorBypass(_Strict):
    """Skip a successor when its cluster agrees (MOSAIC's adaptive aggregation)."""

    enabled: bool = False
    criterion: Literal["answer", "q"] = "answer"
    q_threshold: float = Field(default=0.9, gt=0.0, le=1.0)


class PoolCandidate(_Strict):
    """One candidate proposer of a pool: a model of the config, a persona, sampling overrides.
    It becomes an agent of the same id (template `pool.user` with `persona` as its system
    prompt) that runs only on the questions routing chooses it for."""

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    model: str
    persona: str | None = None
    sampling: Sampling = Sampling()


class Pool(_Strict):
    """Candidate proposers. A successor's template reads whichever of them were chosen through
    the one variadic slot `<|answers:pool|>`: it expands to `item` once per candidate (`{n}`:
    its position, `<|answer|>`: its answer), joined by `separator`; the candidates not chosen
    are dropped from the prompt as early exit drops a slot, so positions 1..k stay in order."""

    candidates: list[PoolCandidate]
    user: str = QUESTION_FIELD
    item: str = "[Candidate {n}]\n<|answer|>"
    separator: str = "\n\n"

    @field_validator("candidates")
    @classmethod
    def _some(cls, candidates: list[PoolCandidate]) -> list[PoolCandidate]:
        if not candidates:
            raise ValueError("the pool has no candidates; add at least one or remove the pool")
        return candidates

    @field_validator("item")
    @classmethod
    def _one_answer(cls, item: str) -> str:
        if item.count(POOL_ITEM_ANSWER) != 1:
            raise ValueError(f"pool.item must hold {POOL_ITEM_ANSWER} exactly once")
        return item


class RoutingWeights(_Strict):
    """The ranking: performance × p − cost × (tokens × size, as a share of the pool's largest)
    − latency × (predicted seconds, as a share of the pool's slowest)."""

    performance: float = Field(default=1.0, ge=0.0)
    cost: float = Field(default=0.0, ge=0.0)
    latency: float = Field(default=0.0, ge=0.0)


class PosteriorCorrection(_Strict):
    """After the chosen proposers answered: score each answer from its confidence (exp of its
    mean token logprob) and its agreement with the others (the early-exit embeddings), with the
    scorer's prior; answers below `relative_cutoff` × the best score are dropped from the
    successor's prompt or ordered last. Nothing is re-generated."""

    enabled: bool = False
    action: Literal["drop", "last"] = "last"
    prior_weight: float = Field(default=1.0, ge=0.0)
    confidence_weight: float = Field(default=1.0, ge=0.0)
    agreement_weight: float = Field(default=1.0, ge=0.0)
    relative_cutoff: float = Field(default=0.8, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _some_weight(self) -> PosteriorCorrection:
        if self.prior_weight + self.confidence_weight + self.agreement_weight <= 0.0:
            raise ValueError("every posterior weight is 0; give at least one a positive weight")
        return self


class Routing(_Strict):
    """Which pool candidates run per question, chosen before any runs (RouteMoA)."""

    # A path relative to the cwd in a start-up config; over HTTP, a path or `sha256:` digest
    # the router loaded at start, or the scorer inline (routing/routing_files.py).
    scorer: str = Field(description="scorer.json (moa-pd train-scorer); relative to the cwd")
    k: int | None = Field(default=None, ge=1)
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    min_k: int = Field(default=1, ge=1)  # in either mode
    # At most this many candidates of one model (its personas share its mistakes); None: any.
    max_per_model: int | None = Field(default=None, ge=1)
    weights: RoutingWeights = RoutingWeights()
    # Parameters in billions per model name; else counted from the model's config.json.
    model_sizes_b: dict[str, float] = {}
    # profile.json (moa-pd profile): decode seconds per token; else `decode_tokens_per_s`.
    profile: str | None = None
    decode_tokens_per_s: dict[str, float] = {}
    posterior_correction: PosteriorCorrection = PosteriorCorrection()

    @model_validator(mode="after")
    def _one_rule(self) -> Routing:
        if (self.k is None) == (self.threshold is None):
            raise ValueError(
                "routing takes either k (run the k best) or threshold (run all whose "
                "predicted p reaches it), exactly one of them"
            )
        return self


class TopologyConfig(_Strict):
    name: str
    description: str = ""
    models: dict[str, ModelSpec]
    # Before `agents`: an error in a candidate is reported at pool.candidates[i], not at the
    # agent it expands to.
    pool: Pool | None = None
    routing: Routing | None = None
    templates: dict[str, Template]
    agents: list[Agent]
    sampling: Sampling = Sampling(max_new_tokens=256, temperature=0.0)
    final_agent: str | None = None
    early_exit: EarlyExit = EarlyExit()
    incremental_prefill: IncrementalPrefill = IncrementalPrefill()
    # Which precursor fills which slot position (router/successor_prompt.py).
    slot_order: Literal["template", "dynamic", "shortest_first"] = "template"
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

        self._check_pool()
        check_graph(self)
        return self

    def _check_pool(self) -> None:
        """Raise GraphError for a pool or routing section that cannot run. The pool must be
        expanded already: router.config_loader does that (routing.pool_expansion) before it
        validates, so the graph, the launcher, incremental prefill and early exit see an
        ordinary topology whose candidates are agents."""
        from router.topology import GraphError

        if self.pool is None:
            if self.routing is not None:
                raise GraphError(
                    "routing",
                    "routing chooses among a pool's candidates; add a pool or remove routing",
                )
            return
        ids = [c.id for c in self.pool.candidates]
        for i, c in enumerate(self.pool.candidates):
            if c.id in ids[:i]:
                raise GraphError(
                    f"pool.candidates[{i}].id",
                    f"duplicate candidate id '{c.id}'; ids must be unique",
                )
        agent_ids = {a.id for a in self.agents}
        if missing := [i for i in ids if i not in agent_ids]:
            raise GraphError(
                "pool",
                f"candidate(s) {', '.join(missing)} are not agents: the pool was not expanded; "
                "load configs with router.config_loader (load_config, config_from_dict)",
            )
        for i, c in enumerate(self.pool.candidates):
            where = f"pool.candidates[{i}]"
            if c.model not in self.models:
                raise GraphError(
                    f"{where}.model",
                    f"candidate '{c.id}' names model '{c.model}', which is not under \"models\" "
                    f"(known: {', '.join(sorted(self.models))}); add it or fix the name",
                )
            tname = pool_template_name(c.id)
            if self.templates.get(tname) != Template(user=self.pool.user, system=c.persona):
                raise GraphError(
                    f"templates.{tname}",
                    f"the template name '{tname}' is kept for pool candidate '{c.id}'; rename it",
                )
            if sum(a.id == c.id for a in self.agents) > 1:
                raise GraphError(
                    f"{where}.id",
                    f"candidate id '{c.id}' is also the id of a declared agent; rename one of them",
                )
        readers = [t for t in self.templates.values() if set(ids) & set(t.slots)]
        if not readers:
            raise GraphError(
                "pool",
                f"no template reads the pool; put {POOL_SLOT} into the template of the agent "
                "that aggregates the chosen proposers",
            )
        r = self.routing
        if r is None:
            return
        for key in ("k", "min_k"):
            if (v := getattr(r, key)) is not None and v > len(ids):
                raise GraphError(
                    f"routing.{key}",
                    f"{key} is {v} but the pool has {len(ids)} candidates; lower it",
                )

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

    @property
    def pool_ids(self) -> list[str]:
        """The pool's candidate ids (agents routing may leave out), in pool order."""
        return [c.id for c in self.pool.candidates] if self.pool else []

    def sampling_of(self, agent_id: str) -> Sampling:
        return self.agent(agent_id).sampling.merged_over(self.sampling)

    @property
    def final(self) -> str:
        from router.topology import sinks

        return self.final_agent or sinks(self)[0]
