"""What one question asks of the deployment: per agent its model, precursors, the token counts of
its prompt's static pieces (head, between the slots, tail) and of its output, and whether early
exit killed it. From a recorded run (results.jsonl: the agents' output and prompt tokens), or,
without one, from the config (each agent writes its max_new_tokens; the static pieces as
planning.prompt_length estimates them, the planner's estimate too)."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.results import ResultRow
from planning.prompt_length import DEFAULT_QUESTION_TOKENS, static_pieces
from router.config import SLOT_PATTERN, TopologyConfig
from router.topology import decode_budget, layers


@dataclass(frozen=True, slots=True)
class AgentWork:
    agent: str
    model: str
    layer: int
    precursors: tuple[str, ...]  # slots, in template order
    pieces: tuple[int, ...]  # static tokens: head, each between, tail (len(precursors) + 1)
    output_tokens: int
    piece_keys: tuple[str, ...]  # the static pieces' text (prefix caching across agents)
    killed: bool = False  # early exit cut it (from a trace)


@dataclass(frozen=True, slots=True)
class QuestionWork:
    qid: str
    config: str
    final: str
    agents: dict[str, AgentWork]
    # The order its agents started in, where a trace recorded it (else the router's rule,
    # router/priority.start_order, decides when it runs).
    start_order: tuple[str, ...] | None = None


def _split(total: int, weights: tuple[int, ...]) -> tuple[int, ...]:
    """`total` tokens over the pieces in proportion to `weights` (at least 1 each)."""
    s = max(1, sum(weights))
    out = [max(1, round(total * w / s)) for w in weights]
    out[0] += total - sum(out)
    return tuple(max(1, n) for n in out)


def from_config(
    cfg: TopologyConfig, qid: str = "q", question_tokens: int = DEFAULT_QUESTION_TOKENS
) -> QuestionWork:
    depth = layers(cfg)
    agents = {}
    for a in cfg.agents:
        agents[a.id] = AgentWork(
            a.id,
            a.model,
            depth[a.id],
            tuple(cfg.precursors(a.id)),
            static_pieces(cfg, a.id, question_tokens),
            decode_budget(cfg, a.id),
            _piece_keys(cfg, a.id),
        )
    return QuestionWork(qid, cfg.name, cfg.final, agents)


def from_trace(cfg: TopologyConfig, row: ResultRow) -> QuestionWork:
    """The question as `row` ran it: each agent's output length and static prompt tokens."""
    if row.config is not None and row.config != cfg.name:
        raise ValueError(f"trace row {row.sample_id} ran config '{row.config}', not '{cfg.name}'")
    base = from_config(cfg, row.sample_id)
    agents = {}
    for aid, work in base.agents.items():
        t = row.agents.get(aid)
        if t is None:
            raise ValueError(
                f"trace row {row.sample_id} (setting {row.setting}) has no agent '{aid}' of "
                f"config '{cfg.name}'; record the run with this config"
            )
        # A killed agent produced what it produced (possibly nothing); one with no ids recorded
        # (a trace without them) decodes its budget.
        out = len(t.output_ids) if t.killed or t.output_ids else work.output_tokens
        static = sum(work.pieces)
        if t.prompt_tokens:
            pre = sum(len(row.agents[p].output_ids) for p in work.precursors if p in row.agents)
            static = max(len(work.pieces), t.prompt_tokens - pre)
        agents[aid] = AgentWork(
            aid,
            work.model,
            work.layer,
            work.precursors,
            _split(static, work.pieces),
            out,
            work.piece_keys,
            killed=t.killed,
        )
    return QuestionWork(row.sample_id, cfg.name, cfg.final, agents, _start_order(row, agents))


def _start_order(row: ResultRow, agents: dict[str, AgentWork]) -> tuple[str, ...]:
    """The order `row`'s agents started in: as recorded, else the config's (every run before
    the router recorded it started them so)."""
    index = {a: row.agents[a].start_index for a in agents}
    if None in index.values():
        return tuple(agents)
    return tuple(sorted(agents, key=index.__getitem__))


def _piece_keys(cfg: TopologyConfig, agent: str) -> tuple[str, ...]:
    """The text of each static piece: agents whose templates begin alike (the aggregators' shared
    instructions) share those tokens in the radix cache, as far as the text agrees."""
    tpl = cfg.template_of(agent)
    parts = SLOT_PATTERN.split(tpl.user)[::2]
    return (f"{tpl.system}\x00{parts[0]}", *parts[1:])
