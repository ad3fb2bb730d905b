"""A config's pool as ordinary agents: each candidate becomes an agent (template `pool.ID`: the
pool's user text with the candidate's persona as system prompt) and `<|answers:pool|>` becomes
one answer slot per candidate, so every later stage sees a plain topology. `check_pool` names
what is wrong with a pool or routing section by its JSON path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from router.config import POOL_ITEM_ANSWER, POOL_SLOT, Agent, Pool, Template
from router.topology import GraphError

if TYPE_CHECKING:
    from router.config import TopologyConfig


def template_name(candidate_id: str) -> str:
    return f"pool.{candidate_id}"


def pool_slots(pool: Pool) -> str:
    """What `<|answers:pool|>` stands for: every candidate's item, in pool order."""
    return pool.separator.join(
        pool.item.replace("{n}", str(n)).replace(POOL_ITEM_ANSWER, f"<|answer:{c.id}|>")
        for n, c in enumerate(pool.candidates, 1)
    )


def _same_agent(raw: object, generated: dict) -> bool:
    try:
        return Agent.model_validate(raw) == Agent.model_validate(generated)
    except ValidationError:
        return False


def expand_pool(data: object) -> object:
    """The raw config with its pool expanded (idempotent: a dumped, expanded config expands to
    itself). A config without a pool, or with one that does not validate (its field reports
    the error at its own path), comes back unchanged."""
    if not isinstance(data, dict) or data.get("pool") is None:
        return data
    try:
        pool = Pool.model_validate(data["pool"])
    except ValidationError:
        return data
    agents = data.get("agents")
    templates = data.get("templates")
    if not isinstance(agents, list) or not isinstance(templates, dict):
        return data
    templates = dict(templates)
    new_agents = []
    for c in pool.candidates:
        tname = template_name(c.id)
        template = {"user": pool.user} | ({"system": c.persona} if c.persona is not None else {})
        templates.setdefault(tname, template)
        agent = {
            "id": c.id,
            "model": c.model,
            "template": tname,
            "sampling": c.sampling.model_dump(exclude_none=True),
        }
        if not any(
            isinstance(a, dict) and a.get("id") == c.id and _same_agent(a, agent) for a in agents
        ):
            new_agents.append(agent)
    slots = pool_slots(pool)
    for name, t in templates.items():
        if isinstance(t, dict) and isinstance(t.get("user"), str) and POOL_SLOT in t["user"]:
            templates[name] = {**t, "user": t["user"].replace(POOL_SLOT, slots)}
    return {**data, "templates": templates, "agents": new_agents + agents}


def check_pool(cfg: TopologyConfig) -> None:
    """Raise GraphError for a pool or routing section that cannot run."""
    if cfg.pool is None:
        if cfg.routing is not None:
            raise GraphError(
                "routing", "routing chooses among a pool's candidates; add a pool or remove routing"
            )
        return
    ids = [c.id for c in cfg.pool.candidates]
    for i, c in enumerate(cfg.pool.candidates):
        if c.id in ids[:i]:
            raise GraphError(
                f"pool.candidates[{i}].id", f"duplicate candidate id '{c.id}'; ids must be unique"
            )
    for i, c in enumerate(cfg.pool.candidates):
        where = f"pool.candidates[{i}]"
        if c.model not in cfg.models:
            raise GraphError(
                f"{where}.model",
                f"candidate '{c.id}' names model '{c.model}', which is not under \"models\" "
                f"(known: {', '.join(sorted(cfg.models))}); add it or fix the name",
            )
        tname = template_name(c.id)
        expected = Template(user=cfg.pool.user, system=c.persona)
        if cfg.templates[tname] != expected:
            raise GraphError(
                f"templates.{tname}",
                f"the template name '{tname}' is kept for pool candidate '{c.id}'; rename it",
            )
        if sum(a.id == c.id for a in cfg.agents) > 1:
            raise GraphError(
                f"{where}.id",
                f"candidate id '{c.id}' is also the id of a declared agent; rename one of them",
            )
    readers = [t for t in cfg.templates.values() if set(ids) & set(t.slots)]
    if not readers:
        raise GraphError(
            "pool",
            f"no template reads the pool; put {POOL_SLOT} into the template of the agent that "
            "aggregates the chosen proposers",
        )
    r = cfg.routing
    if r is None:
        return
    for key in ("k", "min_k"):
        if (v := getattr(r, key)) is not None and v > len(ids):
            raise GraphError(
                f"routing.{key}", f"{key} is {v} but the pool has {len(ids)} candidates; lower it"
            )
