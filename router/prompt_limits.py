"""The check that a question fits its topology before anything is sent: each agent's prompt (its
template with the question; a successor's without its precursors' answers, the part known now)
plus its max_new_tokens must fit its model's context, else a 400 naming the agent, the prompt
length and the limit. Called by api_request.py and server.py."""

from __future__ import annotations

from router.config import TopologyConfig
from router.context import RouterContext
from router.template import build_pieces, prompt_ids


class PromptTooLong(ValueError):
    """The question makes an agent's prompt longer than its model's context (HTTP 400)."""


def known_prompt_len(ctx: RouterContext, cfg: TopologyConfig, agent_id: str, question: str) -> int:
    """Tokens of `agent_id`'s prompt known before it runs: all of it for a first-layer agent,
    the template and the question (not the precursors' answers) for a successor."""
    agent = cfg.agent(agent_id)
    tok = ctx.tokenizer(agent.model)
    template = cfg.template_of(agent_id)
    if not cfg.precursors(agent_id):
        return len(prompt_ids(tok, template, question))
    pieces = build_pieces(tok, template, question)
    return len(pieces.head) + sum(map(len, pieces.betweens)) + len(pieces.tail)


def check_prompts_fit(
    ctx: RouterContext, cfg: TopologyConfig, question: str, agents: list[str] | None = None
) -> None:
    """PromptTooLong for the first of `agents` (default: all) whose known prompt, plus its
    max_new_tokens, is over its model's context length. Models of unknown length are left to
    their workers' own check."""
    seen: dict[tuple[str, str], int] = {}
    for agent_id in agents or [a.id for a in cfg.agents]:
        model = cfg.agent(agent_id).model
        limit = ctx.context_len.get(model)
        if limit is None:
            continue
        # Agents of one model and template have the same known prompt: tokenize it once.
        key = (model, cfg.agent(agent_id).template)
        if key not in seen:
            seen[key] = known_prompt_len(ctx, cfg, agent_id, question)
        n = seen[key]
        max_new = cfg.sampling_of(agent_id).max_new_tokens or 0
        if n >= limit:
            raise PromptTooLong(
                f"agent '{agent_id}' (model {model}): its prompt is {n} tokens, at or over the "
                f"model's context length of {limit} tokens; shorten the question"
            )
        if n + max_new > limit:
            raise PromptTooLong(
                f"agent '{agent_id}' (model {model}): its prompt of {n} tokens plus its "
                f"max_new_tokens {max_new} is {n + max_new} tokens, over the model's context "
                f"length of {limit} tokens; shorten the question or lower max_tokens"
            )
