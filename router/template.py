"""A successor's prompt in token space: the static pieces of its chat-rendered template (tokenized
once with its own tokenizer) around its answer slots, and the splice of precursor outputs between
them. Used by the orchestrator (final prompts) and incremental.py (warm-up prefixes)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from router.config import QUESTION_FIELD, SLOT_PATTERN, Template
from router.tokenizers import LoadedTokenizer

# Stands in for a slot while the chat template renders; split on afterwards. No chat template
# rewrites it, and a fresh nonce per render keeps a question from forging it.
_MARKER = "\x00moa-slot-{nonce}-{i}\x00"


@dataclass(frozen=True, slots=True)
class PromptPieces:
    """`head` + slot 1 + `betweens[0]` + slot 2 + ... + slot n + `tail` (token ids).

    With k < n slots kept (early exit dropped some), positions 1..k are used: head, the first
    k-1 betweens, then tail, so labels such as "[Candidate 2]" stay in sequence.
    """

    head: list[int]
    betweens: list[list[int]]
    tail: list[int]
    slots: list[str]


def render_chat(tok: LoadedTokenizer, template: Template, user: str) -> str:
    """The chat-template text of one user turn plus the generation prompt."""
    messages = [{"role": "user", "content": user}]
    if template.system is not None:
        messages.insert(0, {"role": "system", "content": template.system})
    if tok.tok.chat_template is None:
        # Base models: plain text, system first.
        return "\n\n".join(m["content"] for m in messages) + "\n\n"
    return tok.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(tok: LoadedTokenizer, template: Template, question: str) -> list[int]:
    """Token ids of a template without slots (a first-layer agent)."""
    return tok.encode(render_chat(tok, template, template.user.replace(QUESTION_FIELD, question)))


def build_pieces(tok: LoadedTokenizer, template: Template, question: str) -> PromptPieces:
    """Render once with markers in the slots, split at the markers, tokenize each static piece."""
    slots = template.slots
    # Markers first, question second: a question quoting slot syntax stays plain text.
    nonce, counter = uuid.uuid4().hex, iter(range(len(slots)))
    user = SLOT_PATTERN.sub(lambda _: _MARKER.format(nonce=nonce, i=next(counter)), template.user)
    user = user.replace(QUESTION_FIELD, question)
    text = render_chat(tok, template, user)
    pieces: list[str] = []
    for i in range(len(slots)):
        before, sep, text = text.partition(_MARKER.format(nonce=nonce, i=i))
        if not sep:
            raise ValueError(
                f"the chat template of {template!r} dropped answer slot {i}; "
                "slots must sit in the user message"
            )
        pieces.append(before)
    pieces.append(text)
    ids = [tok.encode(p) for p in pieces]
    return PromptPieces(head=ids[0], betweens=ids[1:-1], tail=ids[-1], slots=slots)


def clean_output(ids: list[int], eot_ids: frozenset[int]) -> list[int]:
    """A precursor's output ids fit to splice: end-of-turn tokens removed.

    Removed wherever they occur (not only at the end), so cleaning a growing output is
    prefix-monotone: clean(a prefix) is a prefix of clean(the whole).
    """
    return [t for t in ids if t not in eot_ids]


class TextSplicer:
    """A precursor of another tokenizer family: re-tokenize its text with the successor's
    tokenizer. BPE merges at the end of a growing text can still change, so the last
    `holdback` tokens stay out until the precursor is done; its final ids tokenize the whole text
    at once, exactly as blocking mode does."""

    def __init__(self, tok: LoadedTokenizer, holdback: int = 4) -> None:
        self._tok = tok
        self._holdback = holdback
        self._last_text = ""
        self._last_ids: list[int] = []

    def ids(self, text: str, done: bool) -> list[int]:
        if text != self._last_text:
            self._last_text, self._last_ids = text, self._tok.encode(text)
        if done:
            return list(self._last_ids)
        return self._last_ids[: max(0, len(self._last_ids) - self._holdback)]
