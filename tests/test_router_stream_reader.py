"""Reading streamed /generate chunks into the APC: incremental and cumulative ids (SGLang with
--skip-tokenizer-init), logprobs that cannot be aligned, text decoded when the worker sends none."""

from __future__ import annotations

import itertools

import pytest

from router.stream_reader import StreamReader, new_ids, new_logprobs
from router.tokenizers import TokenizerStore
from sglang_ext import protocol as P
from tests.router_fixtures import smollm_tokenizer_path  # noqa: F401


@pytest.fixture(scope="module")
def tok(smollm_tokenizer_path):  # noqa: F811
    return TokenizerStore().get(smollm_tokenizer_path)


def chunk(ids, n_done, lps=None, text=None) -> dict:
    meta = {P.COMPLETION_TOKENS: n_done}
    if lps is not None:
        meta[P.OUTPUT_TOKEN_LOGPROBS] = [[lp, 0, None] for lp in lps]
    return {P.OUTPUT_IDS: ids, P.META_INFO: meta, **({P.TEXT: text} if text is not None else {})}


def test_new_ids_of_incremental_and_cumulative_chunks():
    assert new_ids([7, 8], {P.COMPLETION_TOKENS: 5}, 3) == [7, 8]  # incremental
    assert new_ids([1, 2, 3, 7, 8], {P.COMPLETION_TOKENS: 5}, 3) == [7, 8]  # cumulative
    assert new_ids([1, 2, 3], {P.COMPLETION_TOKENS: 3}, 3) == []  # nothing new
    assert new_ids([7], {}, 3) == [7]  # no count: taken as incremental


def test_logprobs_that_cannot_be_aligned_are_not_stored():
    lps = [[-0.5, 7, None], [-0.25, 8, None]]
    assert new_logprobs(lps, 1) == [-0.25]  # the tail of a cumulative list
    assert new_logprobs(lps, 2) == [-0.5, -0.25]
    assert new_logprobs(lps[:1], 2) is None  # fewer than ids: no negative-slice misalignment
    assert new_logprobs([], 0) == []


def test_cumulative_chunks_without_text(tok):
    ids = tok.encode("The answer is 5, because 2 plus 3 makes five.")
    reader = StreamReader(tok)
    got, lps = [], []
    for i in range(len(ids)):
        d = reader.feed(chunk(ids[: i + 1], i + 1, [-0.1 * j for j in range(i + 1)]))
        got += d.ids
        lps += d.logprobs
        assert tok.tok.decode(ids).startswith(d.text)
    assert got == ids and lps == [-0.1 * j for j in range(len(ids))]
    assert reader.final_text() == tok.tok.decode(ids)


def test_a_chunk_without_logprobs_stops_storing_them(tok):
    reader = StreamReader(tok)
    assert reader.feed(chunk([5], 1, [-0.5], "a")).logprobs == [-0.5]
    assert reader.feed(chunk([6, 7], 3, [-0.7], "ab")).logprobs == []  # 1 logprob for 2 ids
    assert reader.feed(chunk([8], 4, [-0.8], "abc")).logprobs == []  # stays off: aligned prefix
    assert reader.final_text() == "abc"  # the worker's text wins when it sends one


def test_half_a_character_waits_for_the_rest(tok):
    ids = tok.encode("ok 😀 done")
    reader = StreamReader(tok)
    texts = [reader.feed(chunk([t], i + 1)).text for i, t in enumerate(ids)]
    assert not any(t.endswith("\ufffd") for t in texts)
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == reader.final_text() == "ok 😀 done"
