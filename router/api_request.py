"""The HTTP API's shared pieces: the app's state keys and the parsing of request bodies into a
config, a mode, a question and a Session. Used by server.py and chat_api.py."""

from __future__ import annotations

import json

from aiohttp import web

from router.config import TopologyConfig
from router.config_loader import config_from_dict, load_config
from router.context import RouterContext
from router.orchestrator import MODES, Session
from router.sessions import SessionStore

CTX = web.AppKey("ctx", RouterContext)
STORE = web.AppKey("sessions", SessionStore)
CONFIGS = web.AppKey("configs", dict)
HOOK = web.AppKey("hook", object)


class BadRequest(ValueError):
    """A request body the API cannot serve; the message says which field is wrong and how to fix
    it (HTTP 400)."""


async def read_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def config_of(request: web.Request, ref) -> TopologyConfig:
    """A served config by name, a cfgs/ file (loaded once) or an inline JSON object."""
    if isinstance(ref, dict):
        return config_from_dict(ref, "<inline config>")
    if not isinstance(ref, str) or not ref:
        raise BadRequest("'config' must be a config name, a cfgs/ path or an inline JSON object")
    configs = request.app[CONFIGS]
    if ref not in configs:
        configs[ref] = load_config(ref)
    return configs[ref]


def mode_of(body: dict) -> str:
    mode = body.get("mode", "pipelined")
    if mode not in MODES:
        raise BadRequest(f"'mode' must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def question_of(body: dict) -> str:
    q = body.get("question")
    if not isinstance(q, str) or not q.strip():
        raise BadRequest("'question' must be a non-empty string")
    return q


def _question_id(body: dict) -> str | None:
    qid = body.get("question_id")
    if qid is not None and not isinstance(qid, (str, int)):
        raise BadRequest("'question_id' must be a string (it keys the early-exit draws)")
    return None if qid is None else str(qid)


def _dataset(body: dict) -> tuple[str | None, str | None]:
    """(dataset, BBH task) the question comes from, when the client says so."""
    out = []
    for key in ("dataset", "task"):
        v = body.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            raise BadRequest(f"'{key}' must be a non-empty string (the question's {key}; "
                             "majority vote reads answers with that dataset's extractor)")
        out.append(v)
    return out[0], out[1]


def new_session(request: web.Request, body: dict, cfg: TopologyConfig) -> Session:
    """A whole-graph Session for `body` (question, mode, early_exit, dataset, ...), with the
    early-exit hook when the request or the config asks for it."""
    hook = None
    dataset, task = _dataset(body)
    early_exit = bool(body.get("early_exit", cfg.early_exit.enabled))
    if early_exit or cfg.aggregator_bypass.enabled:
        factory = request.app[HOOK]
        if factory is None:
            raise BadRequest("early exit was asked for but this router has no early-exit hook")
        # The request's flag wins over the config's: the hook reads early_exit.enabled.
        ee = cfg.early_exit.model_copy(update={"enabled": early_exit})
        cfg_ee = cfg.model_copy(update={"early_exit": ee})
        try:
            # A plain factory (tests) takes the config only; EarlyExitHooks also the dataset.
            hook = factory(cfg_ee, dataset, task) if dataset is not None else factory(cfg_ee)
        except ValueError as e:
            raise BadRequest(f"early exit cannot run for config '{cfg.name}': {e}") from e
    return Session(
        request.app[CTX],
        cfg,
        question_of(body),
        mode_of(body),
        body.get("session_id"),
        slot_orders=body.get("slot_orders"),
        on_completion=hook,
        question_id=_question_id(body),
    )
