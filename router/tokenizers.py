"""Tokenizers of the served models, loaded once per path, with what splicing needs from them:
end-of-turn ids and a family fingerprint. Owned by the router's context; no module globals."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from sglang_ext.hf_tokenizer import load_tokenizer

log = logging.getLogger(__name__)

# Special tokens that close a turn in common chat formats; spliced precursor outputs drop them.
_END_OF_TURN = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "</s>",
    "<end_of_turn>",
    "<|end|>",
    "<|return|>",
)


@dataclass(frozen=True, slots=True)
class LoadedTokenizer:
    tok: PreTrainedTokenizerBase
    eot_ids: frozenset[int]
    # Same fingerprint = same vocabulary: outputs splice as token ids, no re-tokenization.
    family: str

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)


class TokenizerStore:
    def __init__(self) -> None:
        self._by_path: dict[str, LoadedTokenizer] = {}

    def get(self, path: str) -> LoadedTokenizer:
        if path not in self._by_path:
            self._by_path[path] = _load(path)
        return self._by_path[path]


def _load(path: str) -> LoadedTokenizer:
    try:
        tok = load_tokenizer(path)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot load tokenizer from {path!r}: {e}; check tokenizer_path in the cluster file"
        ) from e
    vocab = tok.get_vocab()
    eot = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    # Only where the name is a special token: Gemma's vocabulary has "</s>" as plain text
    # (HTML strike-through), which a spliced answer must keep.
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    eot |= {vocab[t] for t in _END_OF_TURN if vocab.get(t) in special}
    digest = hashlib.sha1(repr(sorted(vocab.items())).encode()).hexdigest()[:16]
    log.info("tokenizer %s: vocab %d, end-of-turn ids %s", path, len(vocab), sorted(eot))
    return LoadedTokenizer(tok=tok, eot_ids=frozenset(eot), family=digest)
