"""Loading topology configs from disk, with errors that name the file, the JSON path and the fix.

Every entry point (CLI, launcher, shell router, runner) loads configs here, before any process
starts. pydantic does the checking; this module turns its errors into one readable line each.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from router.config import TopologyConfig
from router.topology import GraphError
from routing.pool_expansion import expand_pool

CFGS_DIR = Path(__file__).resolve().parent.parent / "cfgs"
M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config that cannot be used; str() is the message a user sees."""

    def __init__(self, source: str, path: str, message: str):
        self.source, self.path, self.message = source, path, message
        where = f"{source}: {path}: " if path else f"{source}: "
        super().__init__(where + message)


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A path as given, or a bare name looked up as cfgs/NAME.json."""
    p = Path(name_or_path)
    if _is_file(p):
        return p
    by_name = CFGS_DIR / f"{name_or_path}.json"
    if _is_file(by_name):
        return by_name
    known = sorted(f.stem for f in CFGS_DIR.glob("*.json"))
    hint = difflib.get_close_matches(str(name_or_path), known, n=1)
    raise ConfigError(
        str(name_or_path),
        "",
        "no such config file or name"
        + (f"; did you mean '{hint[0]}'?" if hint else f"; shipped configs: {', '.join(known)}"),
    )


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL byte
        return False


def load_config(name_or_path: str | Path) -> TopologyConfig:
    path = resolve_config_path(name_or_path)
    return parse_config(read_json_file(path, "the file"), source=str(path))


def read_json_file(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(path), "", f"cannot read {what}: {e.strerror}") from None


def load_configs_by_name(paths: list[str | Path]) -> dict[str, TopologyConfig]:
    """Configs as a shell router serves them: by their `name`, whatever their files are called.
    Two different configs under one name are an error (a request could not tell them apart)."""
    by_name: dict[str, TopologyConfig] = {}
    for p in paths:
        cfg = load_config(p)
        if cfg.name in by_name and by_name[cfg.name] != cfg:
            raise ConfigError(
                str(p),
                "name",
                f"another config given here is also named "
                f"'{cfg.name}' but differs; give one of them another name",
            )
        by_name[cfg.name] = cfg
    return by_name


def parse_config(text: str, source: str = "<config>") -> TopologyConfig:
    return config_from_dict(parse_json(text, source), source)


def parse_json(text: str, source: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            source, "", f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None


def config_from_dict(raw: object, source: str = "<config>") -> TopologyConfig:
    """`raw` as a TopologyConfig, its pool expanded first: the candidates become agents, and
    `<|answers:pool|>` their slots (routing.pool_expansion; idempotent on an expanded config)."""
    return validate_object(expand_pool(raw), TopologyConfig, source, "a topology config")


def validate_object(raw: object, schema: type[M], source: str, what: str) -> M:
    """`raw` (parsed JSON) as `schema`, or a ConfigError naming `source` and the JSON path."""
    if not isinstance(raw, dict):
        raise ConfigError(source, "$", f"{what} is a JSON object")
    try:
        return schema.model_validate(raw)
    except ValidationError as e:
        raise first_error(e, schema, source) from None


def first_error(err: ValidationError, schema: type[BaseModel], source: str) -> ConfigError:
    """pydantic's first error as one ConfigError line (any of our JSON schemas: topology
    configs, sweep specs)."""
    first = err.errors()[0]
    loc = list(first["loc"])
    ctx = first.get("ctx") or {}
    # Graph checks raise GraphError inside the model validator; pydantic wraps it in ctx["error"].
    if isinstance(ctx.get("error"), GraphError):
        graph_error: GraphError = ctx["error"]
        return ConfigError(source, graph_error.path, graph_error.message)
    path = _json_path(loc)
    if first["type"] == "extra_forbidden":
        return ConfigError(source, path, _unknown_key_message(loc, schema))
    if first["type"] == "missing":
        return ConfigError(source, path, f"required key '{loc[-1]}' is missing; add it")
    value = first.get("input")
    shown = json.dumps(value) if isinstance(value, (int, float, str, bool)) else None
    msg = first["msg"].removeprefix("Value error, ")
    return ConfigError(source, path, msg + (f" (got {shown})" if shown is not None else ""))


def _json_path(loc: list) -> str:
    """pydantic's loc as a JSON path: agents[3].sampling.max_new_tokens."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "$"


def _unknown_key_message(loc: list, schema: type[BaseModel]) -> str:
    key = str(loc[-1])
    allowed = _allowed_keys(loc[:-1], schema)
    hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
    if hint:
        return f"unknown key '{key}'; did you mean '{hint[0]}'?"
    return f"unknown key '{key}'; allowed keys here: {', '.join(sorted(allowed))}"


def _allowed_keys(parent_loc: list, schema: type[BaseModel]) -> list[str]:
    """Field names of the model found at parent_loc (walking the schema, not the data)."""
    model: type[BaseModel] | None = schema
    for part in parent_loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            # A dict key (a model name, a template name): the value's model is the dict's value type.
            continue
        model = _model_in(field.annotation)
    return list(model.model_fields) if model else []


def _model_in(annotation) -> type[BaseModel] | None:
    """The BaseModel inside an annotation such as list[Agent] or dict[str, ModelSpec]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(getattr(annotation, "__args__", ()) or ()):
        found = _model_in(arg)
        if found:
            return found
    return None
