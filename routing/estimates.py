"""Each pool candidate's cost (output tokens × model size in billions of parameters) and latency
(output tokens × decode seconds per token, from profile.json or a declared decode speed). The
model's size and speed are per config; the output tokens are per question where the scorer
predicts them (routing/scorer_file.py's length model), else the candidate's max_new_tokens
(`Estimate.for_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass

from router.config import TopologyConfig
from router.config_loader import ConfigError
from routing.routing_files import RoutingFiles


@dataclass(frozen=True, slots=True)
class Estimate:
    tokens: int  # the candidate's max_new_tokens: what it may spend
    size_b: float  # parameters, billions
    cost: float  # tokens × size_b
    latency_s: float | None  # None where the config weighs no latency and gives no speed
    model: str = ""  # the candidate's model (routing.max_per_model counts by it)

    def for_tokens(self, predicted: float | None) -> tuple[float, float, float | None]:
        """(tokens, cost, latency) of a question for which `predicted` output tokens are
        expected (None: the cap), never more than the cap: both scale with the tokens."""
        if predicted is None or self.tokens <= 0:
            return float(self.tokens), self.cost, self.latency_s
        tokens = min(float(self.tokens), predicted)
        part = tokens / self.tokens
        return tokens, self.cost * part, None if self.latency_s is None else self.latency_s * part


def model_size_b(
    cfg: TopologyConfig, model: str, source: str, files: RoutingFiles | None = None
) -> float:
    """The declared size, else the parameters counted from the model's config.json (where
    `files` trusts its model_path: by default, any)."""
    declared = cfg.routing.model_sizes_b if cfg.routing else {}
    if model in declared:
        return declared[model]
    from planning.model_memory import ModelConfigError, model_memory

    files = files if files is not None else RoutingFiles.trusting()
    path = files.model_path(cfg, model, source)
    try:
        return model_memory(path).parameters / 1e9
    except (ModelConfigError, ValueError, OSError) as e:  # e.g. a 'dummy:SHAPE' path
        raise ConfigError(
            source,
            "routing.model_sizes_b",
            f"the size of model '{model}' is unknown ({e}); declare it in billions here",
        ) from None


def decode_seconds_per_token(
    cfg: TopologyConfig, model: str, source: str, files: RoutingFiles | None = None
) -> float | None:
    r = cfg.routing
    if r is None:
        return None
    if r.profile is not None:
        files = files if files is not None else RoutingFiles.trusting()
        prof = files.profile(r.profile, source)
        if model in prof.models:
            return prof.models[model].decode_step_seconds(1, 512.0)
    if model in r.decode_tokens_per_s:
        return 1.0 / r.decode_tokens_per_s[model]
    if r.weights.latency > 0.0:
        raise ConfigError(
            source,
            "routing.decode_tokens_per_s",
            f"routing weighs latency but model '{model}' has no decode speed: give it here "
            "(tokens/s) or name a profile.json that profiles it in routing.profile",
        )
    return None


def estimate_pool(
    cfg: TopologyConfig, source: str = "<config>", files: RoutingFiles | None = None
) -> dict[str, Estimate]:
    """Every candidate's estimate; ConfigError (naming `source` and the key) where a size or a
    speed the ranking needs is missing. The profile comes from `files` (by default, read from
    the path the config names)."""
    files = files if files is not None else RoutingFiles.trusting()
    out: dict[str, Estimate] = {}
    sizes: dict[str, float] = {}
    speeds: dict[str, float | None] = {}
    for cid in cfg.pool_ids:
        model = cfg.agent(cid).model
        if model not in sizes:
            sizes[model] = model_size_b(cfg, model, source, files)
            speeds[model] = decode_seconds_per_token(cfg, model, source, files)
        tokens = cfg.sampling_of(cid).max_new_tokens or 0
        s = speeds[model]
        out[cid] = Estimate(
            tokens, sizes[model], tokens * sizes[model], None if s is None else tokens * s, model
        )
    return out
