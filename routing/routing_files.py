"""The files routing reads (routing.scorer, routing.profile, and a model's config.json for its
size), held so that no config registered over HTTP makes the shell router open a file.

- The router's start-up configs (`python -m router --config`: the operator's) name scorer and
  profile files: each is read once, at start, and answers to the path as the config writes it
  and to `sha256:` + the hex digest of its bytes (what `sha256sum` prints).
- A config registered over HTTP (POST /v1/moa/configs) names one of those, by path or digest,
  or sends its own inline: the JSON object in place of the path, validated as the file would be,
  at most MAX_INLINE_BYTES of JSON; it is kept under `sha256:` + the digest of its canonical
  JSON, and the registered config names it so. Any other reference is refused, at registration,
  with one message that never depends on what the path holds or whether it exists: the path is
  never opened, stat'ed or listed.
- A registered routed config's model sizes come from routing.model_sizes_b, or from a model_path
  the router trusts (the deployment's in cluster.json, or a start-up config's); any other
  model_path is refused the same way.

`RoutingFiles.trusting()` is for in-process use (tests, a Session built by hand, the operator's
own tools): it reads any path on demand, as routing always did. The shell router never uses it.
`inline_routing_files` is the client's side: the runner sends its scorer and profile inline."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from profiling.profile_file import Profile
from router.config import TopologyConfig
from router.config_loader import ConfigError, validate_object
from routing.scorer_file import Scorer

# An inline scorer or profile: at most this many bytes of (compact) JSON. A scorer of 16
# candidates on 1024-dimensional embeddings is about 350 KB.
MAX_INLINE_BYTES = 1024**2
# Distinct inline files a router keeps (each at most MAX_INLINE_BYTES); then it refuses more.
MAX_INLINE_FILES = 64
DIGEST_PREFIX = "sha256:"
REQUEST = "request body"  # the source a registration's errors name


class FileRefused(ConfigError):
    """A registered config names a file the router did not load at start, or sends one it
    cannot take (HTTP 400)."""


@dataclass(frozen=True)
class FileKind:
    key: str  # the key under `routing`
    what: str  # the file's name in messages
    schema: type[BaseModel]

    @property
    def field(self) -> str:
        return f"routing.{self.key}"


SCORER = FileKind("scorer", "scorer.json", Scorer)
PROFILE = FileKind("profile", "profile.json", Profile)
KINDS = (SCORER, PROFILE)


@dataclass(frozen=True, eq=False)
class Entry:
    """One loaded file: its content and the digest a registered config may name it by."""

    content: BaseModel
    digest: str  # "sha256:..."


@dataclass
class Admitted:
    """A registration's body with every inline file replaced by its digest, and the inline
    files it adds (kept once the registration is accepted: `RoutingFiles.keep`)."""

    raw: dict
    new: list[tuple[FileKind, str, Entry]] = field(default_factory=list)


def resolve_path(path: str) -> Path:
    """A path from an operator's config: as given (relative to the cwd), else relative to the
    repository root (where shipped configs name their fixtures)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        repo = Path(__file__).resolve().parent.parent / p
        if repo.exists():
            return repo
    return p


def _sha256(data: bytes) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def _canonical(content: BaseModel) -> bytes:
    doc = content.model_dump(mode="json", by_alias=True)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def content_digest(content: BaseModel) -> str:
    """The digest an inline scorer or profile is kept under: `sha256:` + the hex digest of its
    validated content as compact JSON with sorted keys (defaults filled in)."""
    return _sha256(_canonical(content))


class RoutingFiles:
    """Per router process: the scorers and profiles its configs may route with, by reference
    (a start-up path as written, or a digest)."""

    def __init__(self, trust_paths: bool = False) -> None:
        self._trust_paths = trust_paths
        self._refs: dict[str, dict[str, Entry]] = {k.key: {} for k in KINDS}
        # By the digest of the canonical JSON: an inline copy of a loaded file is that file.
        self._by_content: dict[str, dict[str, Entry]] = {k.key: {} for k in KINDS}
        # A start-up path that could not be loaded -> why (said when its config is routed).
        self._failed: dict[str, dict[str, str]] = {k.key: {} for k in KINDS}
        self._inline = 0
        # Model name -> the model_paths whose config.json the router may read for its size.
        self._model_paths: dict[str, set[str]] = {}

    @classmethod
    def trusting(cls) -> RoutingFiles:
        """Reads any path a config names, on demand (in-process use; never the shell router)."""
        return cls(trust_paths=True)

    @classmethod
    def at_start(
        cls, configs: Iterable[TopologyConfig], deployed: Mapping[str, str] | None = None
    ) -> RoutingFiles:
        """The shell router's: the files its start-up `configs` name, read now (a file that
        cannot be read fails its config when routed, as before); `deployed` is each served
        model's model_path (cluster.json)."""
        files = cls()
        for model, path in (deployed or {}).items():
            if path:
                files._model_paths.setdefault(model, set()).add(path)
        for cfg in configs:
            for name, spec in cfg.models.items():
                files._model_paths.setdefault(name, set()).add(spec.model_path)
            if cfg.routing is None:
                continue
            for kind in KINDS:
                ref = getattr(cfg.routing, kind.key)
                if ref is not None and ref not in files._refs[kind.key]:
                    files._load(kind, ref)
        return files

    # --- the operator's files ---------------------------------------------------------------
    def _load(self, kind: FileKind, ref: str) -> Entry | None:
        path = resolve_path(ref)
        try:
            data = path.read_bytes()
            content = kind.schema.model_validate_json(data)
        except OSError as e:
            self._failed[kind.key][ref] = f"cannot read {path}: {e.strerror}"
            return None
        except ValidationError as e:
            self._failed[kind.key][ref] = f"{path} is no {kind.what}: {e.errors()[0]['msg']}"
            return None
        entry = self._by_content[kind.key].setdefault(
            content_digest(content), Entry(content, _sha256(data))
        )
        self._refs[kind.key][ref] = self._refs[kind.key][entry.digest] = entry
        self._refs[kind.key].setdefault(_sha256(data), entry)
        return entry

    def _get(self, kind: FileKind, ref: str, source: str) -> BaseModel:
        entry = self._refs[kind.key].get(ref)
        if entry is None and self._trust_paths:
            self._failed[kind.key].pop(ref, None)  # read again: the file may be there now
            entry = self._load(kind, ref)
        if entry is not None:
            return entry.content
        failed = self._failed[kind.key].get(ref)
        raise ConfigError(source, kind.field, failed or self._refusal(kind))

    def scorer(self, ref: str, source: str) -> Scorer:
        """The scorer `ref` names (ConfigError when none was loaded under it)."""
        return self._get(SCORER, ref, source)

    def profile(self, ref: str, source: str) -> Profile:
        return self._get(PROFILE, ref, source)

    # --- a registration -----------------------------------------------------------------------
    def _refusal(self, kind: FileKind) -> str:
        """The one message for a reference that is no loaded file: it depends on the router's
        start-up files only, never on the reference."""
        loaded = sorted(
            f"{ref} ({e.digest})"
            for ref, e in self._refs[kind.key].items()
            if not ref.startswith(DIGEST_PREFIX)
        )
        return (
            f"a config registered over HTTP may name only a {kind.key} this router loaded at "
            f"start, by its path or digest (loaded: {', '.join(loaded) or 'none'}), or send one "
            f"inline: the {kind.what} content as a JSON object in place of the path, at most "
            f"{MAX_INLINE_BYTES} bytes; no file a request names is read"
        )

    def admit(self, raw: object) -> Admitted:
        """A registration's body (parsed JSON) with its routing files checked: a reference
        must be a loaded file's path or digest (else FileRefused, whatever the path is), an
        inline file is validated (ConfigError), bounded (FileRefused) and replaced by its
        digest. Nothing is kept yet (`keep`), nothing is read."""
        routing = raw.get("routing") if isinstance(raw, dict) else None
        if not isinstance(routing, dict):
            return Admitted(raw)
        out = Admitted({**raw, "routing": dict(routing)})
        for kind in KINDS:
            ref = routing.get(kind.key)
            if ref is None or (isinstance(ref, str) and ref in self._refs[kind.key]):
                continue
            if not isinstance(ref, dict):
                raise FileRefused(REQUEST, kind.field, self._refusal(kind))
            entry = self._inline_entry(kind, ref, out)
            out.raw["routing"][kind.key] = entry.digest
        return out

    def _inline_entry(self, kind: FileKind, doc: dict, out: Admitted) -> Entry:
        size = len(json.dumps(doc, separators=(",", ":")).encode())
        if size > MAX_INLINE_BYTES:
            raise FileRefused(
                REQUEST,
                kind.field,
                f"the inline {kind.key} is {size} bytes of JSON, over the {MAX_INLINE_BYTES} "
                "this router takes",
            )
        try:
            content = validate_object(doc, kind.schema, REQUEST, f"a {kind.what}")
        except ConfigError as e:
            path = kind.field if e.path in ("", "$") else f"{kind.field}.{e.path}"
            raise ConfigError(e.source, path, f"(inline {kind.what}) {e.message}") from None
        digest = content_digest(content)
        known = self._by_content[kind.key].get(digest)
        if known is not None:
            return known
        if self._inline >= MAX_INLINE_FILES:
            raise FileRefused(
                REQUEST,
                kind.field,
                f"this router already keeps {MAX_INLINE_FILES} inline scorers and profiles; "
                "name one of them by its digest, or restart it",
            )
        entry = Entry(content, digest)
        out.new.append((kind, digest, entry))
        return entry

    def keep(self, admitted: Admitted) -> None:
        """Keep an accepted registration's inline files."""
        for kind, digest, entry in admitted.new:
            if digest not in self._by_content[kind.key]:
                self._by_content[kind.key][digest] = self._refs[kind.key][digest] = entry
                self._inline += 1

    def check_model_paths(self, cfg: TopologyConfig) -> None:
        """A registered routed config counts a model's parameters (its config.json) only from a
        model_path this router trusts; else FileRefused naming routing.model_sizes_b."""
        if cfg.routing is None:
            return
        for model in sorted({cfg.agent(c).model for c in cfg.pool_ids}):
            if model not in cfg.routing.model_sizes_b:
                self.model_path(cfg, model, REQUEST)

    def model_path(self, cfg: TopologyConfig, model: str, source: str) -> str:
        """The model_path whose config.json gives `model`'s size: the config's, where this
        router trusts it (FileRefused otherwise, whatever the path is)."""
        path = cfg.models[model].model_path
        trusted = self._model_paths.get(model, set())
        if self._trust_paths or path in trusted:
            return path
        raise FileRefused(
            source,
            f"models.{model}.model_path",
            "a config registered over HTTP counts a model's size only from a model_path this "
            f"router deploys or was started with ({', '.join(sorted(trusted)) or 'none'}); use "
            f"it, or declare the size in routing.model_sizes_b.{model} (billions of parameters)",
        )

    def check_registered(self, cfg: TopologyConfig, admitted: Admitted) -> None:
        """A registered routed config's scorer fits it (ConfigError), checked now, not at its
        first question."""
        if cfg.routing is None:
            return
        ref = cfg.routing.scorer
        new = {digest: e for kind, digest, e in admitted.new if kind is SCORER}
        entry = new.get(ref) or self._refs[SCORER.key][ref]
        check_scorer(cfg, entry.content, REQUEST, ref)

    def digests(self, cfg: TopologyConfig) -> dict[str, str]:
        """The digest of each loaded file `cfg` routes with, by its key under `routing`."""
        if cfg.routing is None:
            return {}
        found = {k.key: self._refs[k.key].get(getattr(cfg.routing, k.key) or "") for k in KINDS}
        return {key: e.digest for key, e in found.items() if e is not None}

    def canonical(self, cfg: TopologyConfig) -> TopologyConfig:
        """`cfg` with each loaded file it names as its digest: two configs that differ only in
        naming the same file by path, by digest or inline are the same config."""
        if cfg.routing is None:
            return cfg
        routing = cfg.routing.model_copy(update=self.digests(cfg))
        return cfg.model_copy(update={"routing": routing})


def check_scorer(cfg: TopologyConfig, scorer: Scorer, source: str, shown: str) -> None:
    """ConfigError where `scorer` (named `shown`) cannot route `cfg`: trained on other
    embeddings, or missing a pool candidate."""
    if scorer.embedder != cfg.early_exit.embedding_model:
        raise ConfigError(
            source,
            SCORER.field,
            f"{shown} was trained on '{scorer.embedder}' embeddings, but the config embeds with "
            f"'{cfg.early_exit.embedding_model}' (early_exit.embedding_model); retrain it "
            "(moa-pd train-scorer --embedding-model ...) or embed as it was trained",
        )
    missing = [c for c in cfg.pool_ids if c not in scorer.candidates]
    if missing:
        raise ConfigError(
            source,
            SCORER.field,
            f"{shown} has no model for pool candidates {missing}; train it on runs of them "
            "(moa-pd train-scorer) or remove them from the pool",
        )


def inline_routing_files(raw: dict) -> dict:
    """The client's side: `raw` (a config object) with its routing.scorer and routing.profile
    files read here and sent as JSON objects, so a router that was not started with them can
    take it. Paths resolve as the router resolves its own (the cwd, else the repository)."""
    routing = raw.get("routing")
    if not isinstance(routing, dict):
        return raw
    routing = dict(routing)
    for kind in KINDS:
        ref = routing.get(kind.key)
        if isinstance(ref, str) and not ref.startswith(DIGEST_PREFIX):
            path = resolve_path(ref)
            try:
                routing[kind.key] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ConfigError(str(path), "", f"cannot read {kind.field}'s {kind.what}: {e}")
    return {**raw, "routing": routing}
