"""One agent's streamed /generate reply, read chunk by chunk into what the APC stores: the new token
ids whether SGLang sent them incrementally or cumulatively (`--skip-tokenizer-init` sends every id
so far in each chunk, sglang-notes §4.3), their logprobs, and the text, decoded here when the worker
sends none. Used by agent_runner.py."""

from __future__ import annotations

from dataclasses import dataclass

from router.tokenizers import LoadedTokenizer
from sglang_ext import protocol as P


@dataclass(slots=True)
class Delta:
    """What one chunk adds: new ids, their logprobs (aligned; empty once the worker sent too
    few) and the text so far."""

    ids: list[int]
    logprobs: list[float]
    text: str


def new_ids(ids: list[int], meta: dict, have: int) -> list[int]:
    """The ids of a chunk not seen before, given `have` ids so far. meta_info's
    `completion_tokens` counts every output token so far, so the last `completion_tokens - have`
    ids of the chunk are new, whether it holds only those (incremental) or all (cumulative).
    Without that count the chunk is taken as incremental."""
    total = meta.get(P.COMPLETION_TOKENS)
    if not isinstance(total, int) or isinstance(total, bool):
        return list(ids)
    n = max(0, total - have)
    return list(ids[len(ids) - n :]) if n < len(ids) else list(ids)


def new_logprobs(lps: list, n: int) -> list[float] | None:
    """Logprobs of the last `n` ids: the tail of an incremental or cumulative list; None when
    the list holds fewer than `n` (they cannot be aligned to the ids)."""
    if len(lps) < n:
        return None
    return [float(x[0]) for x in lps[len(lps) - n :]] if n else []


class StreamReader:
    """Reads one reply's chunks in order; `meta` is the last chunk's meta_info."""

    def __init__(self, tok: LoadedTokenizer) -> None:
        self._tok = tok
        self._ids: list[int] = []
        self._logprobs_ok = True
        self._worker_text: str | None = None
        # Incremental detokenization when the worker sends no text: ids[_prefix:_read] is the
        # window decoded last time, so new text is the difference of two short decodes; a
        # trailing U+FFFD (half a UTF-8 character) waits for the next token.
        self._decoded = ""
        self._prefix = self._read = 0
        self.meta: dict = {}

    def feed(self, chunk: dict) -> Delta:
        self.meta = chunk.get(P.META_INFO) or {}
        ids = new_ids(chunk.get(P.OUTPUT_IDS) or [], self.meta, len(self._ids))
        lps = None
        if self._logprobs_ok:
            lps = new_logprobs(self.meta.get(P.OUTPUT_TOKEN_LOGPROBS) or [], len(ids))
        # Once a chunk came without logprobs, store none after it: logprobs[i] must stay the
        # logprob of output_ids[i].
        self._logprobs_ok = lps is not None
        self._ids += ids
        text = chunk.get(P.TEXT)
        if isinstance(text, str):
            self._worker_text = text
            return Delta(ids, lps or [], text)
        return Delta(ids, lps or [], self._decode())

    def final_text(self) -> str:
        """The whole text once the stream ended (decoded in one piece when the worker sent
        none)."""
        if self._worker_text is not None:
            return self._worker_text
        return self._tok.tok.decode(self._ids, skip_special_tokens=True)

    def _decode(self) -> str:
        if self._worker_text is not None:
            return self._worker_text
        decode = self._tok.tok.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self._ids[self._prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._decoded += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._decoded
