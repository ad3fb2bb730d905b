"""The HTTP API's shared pieces: the app's state keys and the turning of a parsed request
(router/api_schema.py) into a served config and a Session (whose prompts fit their models).
Used by server.py and chat_api.py."""

from __future__ import annotations

import json

from aiohttp import web
from pydantic import BaseModel

from router.api_schema import BadRequest, parse
from router.config import TopologyConfig
from router.context import RouterContext
from router.orchestrator import Session
from router.prompt_limits import check_prompts_fit
from router.served_configs import ServedConfigs
from router.sessions import SessionStore

CTX = web.AppKey("ctx", RouterContext)
STORE = web.AppKey("sessions", SessionStore)
CONFIGS = web.AppKey("configs", ServedConfigs)
HOOK = web.AppKey("hook", object)
# routing.router_hook.PoolRouters: per config, the pool router and posterior correction.
ROUTERS = web.AppKey("routers", object)
# The cluster's internal URLs, kept out of every error a client sees (api_errors.scrub).
ADDRESSES = web.AppKey("addresses", list)

__all__ = [
    "ADDRESSES",
    "CONFIGS",
    "CTX",
    "HOOK",
    "ROUTERS",
    "STORE",
    "BadRequest",
    "config_of",
    "new_session",
    "read_request",
    "with_final_sampling",
]


async def read_request(request: web.Request, schema: type[BaseModel]) -> BaseModel:
    """The body as `schema`; BadRequest for a body that is not UTF-8, not JSON or not valid.
    (A body over the size limit raises aiohttp's 413, which server.py answers as JSON.)"""
    raw = await request.read()
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadRequest(
            f"the body is not UTF-8 (byte {e.start}); send JSON encoded as UTF-8"
        ) from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not JSON: {e}") from None
    return parse(schema, body)


def config_of(request: web.Request, ref: str | dict, param: str) -> TopologyConfig:
    """The served config named `ref` (the request's field `param`), or ModelNotFound (404).
    A name is only looked up, never read as a path. An inline config is refused: what a router
    runs is what it was started with or what was registered, each listed by GET /v1/models."""
    if isinstance(ref, dict):
        raise BadRequest(
            f"'{param}' must name a served topology (GET /v1/models lists them), not hold a "
            "config; register the config first with POST /v1/moa/configs, then name it"
        )
    return request.app[CONFIGS].get(ref, param)


def with_final_sampling(cfg: TopologyConfig, overrides: dict) -> TopologyConfig:
    """`cfg` with the final agent's sampling updated (an OpenAI request's max_tokens, stop,
    temperature, ...); the served config itself is left as it is. Stop strings add to the
    config's own."""
    if not overrides:
        return cfg
    agent = cfg.agent(cfg.final)
    merged = cfg.sampling_of(cfg.final)
    if overrides.get("stop") and merged.stop:
        overrides = {**overrides, "stop": list(dict.fromkeys(merged.stop + overrides["stop"]))}
    sampling = agent.sampling.model_copy(update=overrides)
    agents = [
        a.model_copy(update={"sampling": sampling}) if a.id == agent.id else a for a in cfg.agents
    ]
    return cfg.model_copy(update={"agents": agents})


def new_session(
    request: web.Request,
    cfg: TopologyConfig,
    question: str,
    mode: str,
    early_exit: bool | None = None,
    session_id: str | None = None,
    slot_orders: dict | None = None,
    question_id: str | int | None = None,
    dataset: str | None = None,
    task: str | None = None,
) -> Session:
    """A whole-graph Session, with the early-exit hook when the request (`early_exit`) or the
    config asks for it. `dataset` (and BBH's `task`) pick the answer extractor majority vote
    uses."""
    # Before anything is sent: a question too long for an agent's model is the client's 400.
    request.app[CTX].check_served(cfg)
    check_prompts_fit(request.app[CTX], cfg, question)
    hook = None
    early_exit = cfg.early_exit.enabled if early_exit is None else early_exit
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
    route = posterior = None
    if cfg.routing is not None:
        routers = request.app[ROUTERS]
        try:
            route, posterior = routers(cfg), routers.posterior(cfg)
        except ValueError as e:  # a ConfigError: the scorer or a size/speed is missing
            raise BadRequest(f"routing cannot run for config '{cfg.name}': {e}") from e
    return Session(
        request.app[CTX],
        cfg,
        question,
        mode,
        session_id,
        slot_orders=slot_orders,
        on_completion=hook,
        question_id=None if question_id is None else str(question_id),
        route=route,
        posterior=posterior,
    )
