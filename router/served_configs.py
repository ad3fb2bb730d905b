"""The topologies a shell router serves, by name: the configs it was started with
(`python -m router --config`) plus those registered since through `POST /v1/moa/configs` (the
runner registers the configs it runs). A request names one of them; nothing a client sends
makes the router read a file: a registered config may use only the embedding models, scorers
and profiles the router loaded at start, or scorers and profiles sent inline
(routing/routing_files.py). Used by api_request.py and server.py."""

from __future__ import annotations

from collections.abc import Iterable

from router.config import TopologyConfig
from router.embedder import DEFAULT_MODEL
from routing.routing_files import Admitted, RoutingFiles

# A router lives for days and a sweep registers a variant per run: enough, and bounded.
MAX_REGISTERED = 1000


class ModelNotFound(LookupError):
    """A request names a topology this router does not serve (HTTP 404, OpenAI's
    `model_not_found`); `param` is the request field that named it."""

    def __init__(self, name: str, served: list[str], param: str) -> None:
        shown = name if len(name) <= 80 else name[:77] + "..."
        super().__init__(
            f"the {param} '{shown}' is not a topology this router serves (served: "
            f"{', '.join(served) or 'none'}); name one of them, or register a topology with "
            "POST /v1/moa/configs"
        )
        self.param = param


class ConfigConflict(ValueError):
    """A registration under a name already served with another body (HTTP 409)."""


class RegistrationRefused(ValueError):
    """A registration this router cannot take: it would load something new on the host (an
    embedding model nobody deployed), or the registry is full (HTTP 400)."""


def needs_embedder(cfg: TopologyConfig) -> bool:
    """Whether a question of `cfg` may load its embedding model (a request can turn method-q
    early exit on even where the config leaves it off; routing embeds every question)."""
    bypass = cfg.aggregator_bypass
    return (
        cfg.early_exit.method == "q"
        or (bypass.enabled and bypass.criterion == "q")
        or cfg.routing is not None
    )


class ServedConfigs:
    """`files`: the scorers and profiles routing may use (by default, those `configs` name,
    read now)."""

    def __init__(
        self, configs: dict[str, TopologyConfig], files: RoutingFiles | None = None
    ) -> None:
        self._by_name = dict(configs)
        self.files = files if files is not None else RoutingFiles.at_start(configs.values())
        self._registered = 0
        # Embedding models a registered config may use: those the start-up configs load (the
        # router checked them at start) and the bundled default, which names no path.
        self._embedders = {DEFAULT_MODEL} | {
            c.early_exit.embedding_model for c in configs.values() if needs_embedder(c)
        }

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def values(self) -> Iterable[TopologyConfig]:
        return self._by_name.values()

    def get(self, name: str, param: str) -> TopologyConfig:
        """The served config `name`, or ModelNotFound listing the served names."""
        cfg = self._by_name.get(name)
        if cfg is None:
            raise ModelNotFound(name, self.names(), param)
        return cfg

    def register(self, cfg: TopologyConfig, admitted: Admitted | None = None) -> bool:
        """Serve `cfg` under its name; True when it is new, False when that name already
        serves the same config (naming the same scorer and profile by path, by digest or
        inline counts as the same). ConfigConflict when it serves another one. `admitted`:
        the inline files of `cfg`'s registration (RoutingFiles.admit), kept once it is."""
        known = self._by_name.get(cfg.name)
        if known is not None:
            if self.files.canonical(known) != self.files.canonical(cfg):
                raise ConfigConflict(
                    f"a different topology is already served as '{cfg.name}'; register this "
                    "one under another name"
                )
            return False
        if needs_embedder(cfg) and cfg.early_exit.embedding_model not in self._embedders:
            raise RegistrationRefused(
                f"early_exit.embedding_model '{cfg.early_exit.embedding_model}' is not loaded by "
                f"this router (allowed: {', '.join(sorted(self._embedders))}); serve a config "
                "that uses it with `moa-pd up --config`"
            )
        if self._registered >= MAX_REGISTERED:
            raise RegistrationRefused(
                f"this router already holds {MAX_REGISTERED} registered topologies; restart it"
            )
        self._by_name[cfg.name] = cfg
        self._registered += 1
        if admitted is not None:
            self.files.keep(admitted)
        return True
