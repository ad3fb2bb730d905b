"""One estimate of an agent's prompt, for the planner (KV pools and the cost model) and for the
simulator (a question's work where no trace gives it): its template's static pieces (the text
around the answer slots, in order; the head also holds the system prompt and the chat markup, the
piece with {question} an allowance for the question), in tokens, plus its precursors' outputs.

Tokens are counted by the model's tokenizer where its tokenizer_path or model_path is a local HF
directory; otherwise (an HF id, a model-store name, a 'dummy:' shape) estimated from characters:
the shipped templates run 4.3 (SmolLM2) to 4.8 (Qwen2.5) characters a token, so 4 over-counts a
little. The constants below were measured with the shipped models' tokenizers."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path

from router.config import QUESTION_FIELD, SLOT_PATTERN, TopologyConfig
from router.topology import decode_budget

CHARS_PER_TOKEN = 4
# ChatML's system and user turns and the assistant header (SmolLM2, Qwen2.5, Qwen3: 14 tokens
# around the text; Gemma 3's template: 10).
CHAT_MARKUP_TOKENS = 14
# A question's tokens where a template has {question}: the 90th percentile is 95 on GSM8K, 145 on
# MATH-500, 138 on IFBench (SmolLM2's and Qwen2.5's tokenizers alike); raise it
# (--question-tokens) for long-context datasets (AIME 2025's is 561, MMLU-ProX-Lite's 199).
DEFAULT_QUESTION_TOKENS = 128

Counter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@functools.cache
def _tokenizer_counter(directory: str) -> Counter | None:
    from sglang_ext.hf_tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(directory)
    except Exception:  # noqa: BLE001 - a directory without a usable tokenizer: estimate instead
        return None
    return lambda text: len(tok.encode(text, add_special_tokens=False)) if text else 0


def token_counter(cfg: TopologyConfig, model: str) -> Counter:
    """How `model`'s prompts are counted: its tokenizer where a local directory holds one, else
    the character estimate."""
    spec = cfg.models[model]
    for path in (spec.tokenizer_path, spec.model_path):
        if path and Path(path).expanduser().is_dir():
            counter = _tokenizer_counter(str(Path(path).expanduser().resolve()))
            if counter is not None:
                return counter
    return estimate_tokens


def static_pieces(
    cfg: TopologyConfig, agent_id: str, question_tokens: int = DEFAULT_QUESTION_TOKENS
) -> tuple[int, ...]:
    """Tokens of each static piece of the agent's prompt: the head, each piece between two
    slots, the tail (one more than its slots; each at least 1)."""
    tpl = cfg.template_of(agent_id)
    count = token_counter(cfg, cfg.agent(agent_id).model)
    parts = SLOT_PATTERN.split(tpl.user)[::2]  # the text around the slots
    pieces = [
        count(p.replace(QUESTION_FIELD, "")) + p.count(QUESTION_FIELD) * question_tokens
        for p in parts
    ]
    pieces[0] += count(tpl.system or "") + CHAT_MARKUP_TOKENS
    return tuple(max(1, n) for n in pieces)


def prompt_tokens(
    cfg: TopologyConfig, agent_id: str, question_tokens: int = DEFAULT_QUESTION_TOKENS
) -> int:
    """The agent's prompt: its static pieces and every precursor's whole output."""
    precursors = sum(decode_budget(cfg, p) for p in cfg.precursors(agent_id))
    return sum(static_pieces(cfg, agent_id, question_tokens)) + precursors
