"""A config's pool as ordinary agents: each candidate becomes an agent (template `pool.ID`: the
pool's user text with the candidate's persona as system prompt) and `<|answers:pool|>` becomes
one answer slot per candidate, so every later stage sees a plain topology.

Called by router.config_loader on the raw JSON before it validates a config; the schema
(router.config) owns the pool's types and checks the expanded result, naming what is wrong with a
pool or routing section by its JSON path."""

from __future__ import annotations

from pydantic import ValidationError

from router.config import POOL_ITEM_ANSWER, POOL_SLOT, Agent, Pool, pool_template_name


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
        tname = pool_template_name(c.id)
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
