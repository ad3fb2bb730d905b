"""Each pool candidate's predicted cost (output tokens × model size in billions of parameters)
and latency (output tokens × decode seconds per token, from profile.json or a declared decode
speed), computed once per config: they do not depend on the question."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from router.config import TopologyConfig
from router.config_loader import ConfigError


@dataclass(frozen=True, slots=True)
class Estimate:
    tokens: int  # the candidate's max_new_tokens: what it may spend
    size_b: float  # parameters, billions
    cost: float  # tokens × size_b
    latency_s: float | None  # None where the config weighs no latency and gives no speed


def resolve_path(path: str) -> Path:
    """A path from a config: as given (relative to the cwd), else relative to the repository
    root (where shipped configs name their fixtures)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        repo = Path(__file__).resolve().parent.parent / p
        if repo.exists():
            return repo
    return p


def model_size_b(cfg: TopologyConfig, model: str, source: str) -> float:
    """The declared size, else the parameters counted from the model's config.json."""
    declared = cfg.routing.model_sizes_b if cfg.routing else {}
    if model in declared:
        return declared[model]
    from planning.model_memory import ModelConfigError, model_memory

    try:
        return model_memory(cfg.models[model].model_path).parameters / 1e9
    except (ModelConfigError, ValueError, OSError) as e:  # e.g. a 'dummy:SHAPE' path
        raise ConfigError(
            source,
            "routing.model_sizes_b",
            f"the size of model '{model}' is unknown ({e}); declare it in billions here",
        ) from None


def decode_seconds_per_token(cfg: TopologyConfig, model: str, source: str) -> float | None:
    r = cfg.routing
    if r is None:
        return None
    if r.profile is not None:
        from profiling.profile_file import Profile

        try:
            prof = Profile.load(resolve_path(r.profile))
        except (OSError, ValueError) as e:
            raise ConfigError(source, "routing.profile", f"cannot read {r.profile}: {e}") from None
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


def estimate_pool(cfg: TopologyConfig, source: str = "<config>") -> dict[str, Estimate]:
    """Every candidate's estimate; ConfigError (naming `source` and the key) where a size or a
    speed the ranking needs is missing."""
    out: dict[str, Estimate] = {}
    sizes: dict[str, float] = {}
    speeds: dict[str, float | None] = {}
    for cid in cfg.pool_ids:
        model = cfg.agent(cid).model
        if model not in sizes:
            sizes[model] = model_size_b(cfg, model, source)
            speeds[model] = decode_seconds_per_token(cfg, model, source)
        tokens = cfg.sampling_of(cid).max_new_tokens or 0
        s = speeds[model]
        out[cid] = Estimate(
            tokens, sizes[model], tokens * sizes[model], None if s is None else tokens * s
        )
    return out
