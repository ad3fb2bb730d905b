"""Prompt splicing in token space: static pieces, end-of-turn stripping, token-prefix extension,
slot orders, dropped slots, and text splicing for another tokenizer family."""

from __future__ import annotations

import pytest

from router.answer_cache import AnswerCache, PrecursorFailed
from router.config import Template
from router.successor_prompt import SuccessorPrompt, token_source
from router.template import TextSplicer, build_pieces, clean_output, prompt_ids, render_chat
from router.tokenizers import TokenizerStore
from tests.router_fixtures import smollm_tokenizer_path  # noqa: F401

AGG = Template(
    system="Judge the candidates.",
    user="Question:\n{question}\n\n[Candidate 1]\n<|answer:a|>\n\n[Candidate 2]\n"
    "<|answer:b|>\n\n[Candidate 3]\n<|answer:c|>\n\nNow answer.",
)


@pytest.fixture(scope="module")
def tok(smollm_tokenizer_path):  # noqa: F811
    return TokenizerStore().get(smollm_tokenizer_path)


def make_prompt(tok, apc, dropped=None, **kw) -> SuccessorPrompt:
    pieces = build_pieces(tok, AGG, "What is 2+3?")
    return SuccessorPrompt(
        "agg",
        pieces,
        {s: token_source(tok.eot_ids) for s in pieces.slots},
        apc,
        dropped if dropped is not None else set(),
        **kw,
    )


def test_static_pieces_render_the_chat_template(tok):
    pieces = build_pieces(tok, AGG, "What is 2+3?")
    assert pieces.slots == ["a", "b", "c"]
    text = tok.tok.decode(pieces.head)
    assert text.startswith("<|im_start|>system\nJudge the candidates.<|im_end|>")
    assert text.endswith("[Candidate 1]\n")
    assert tok.tok.decode(pieces.betweens[0]) == "\n\n[Candidate 2]\n"
    assert tok.tok.decode(pieces.tail).endswith("Now answer.<|im_end|>\n<|im_start|>assistant\n")


def test_slotless_prompt_is_the_chat_template(tok):
    t = Template(system="S", user="Q: {question}")
    assert tok.tok.decode(prompt_ids(tok, t, "hi")) == render_chat(tok, t, "Q: hi")


def test_end_of_turn_tokens_are_stripped(tok):
    im_end = tok.tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tok.eot_ids
    assert clean_output([5, 6, im_end], tok.eot_ids) == [5, 6]


async def test_every_state_is_a_token_prefix_of_the_final_prompt(tok):
    apc = AnswerCache(["a", "b", "c"])
    prompt = make_prompt(tok, apc)
    im_end = tok.tok.convert_tokens_to_ids("<|im_end|>")
    outs = {"a": [300, 301, 302, im_end], "b": [400, 401], "c": [500, 501, 502]}
    states = [prompt.state()]
    # Interleaved streaming: c races ahead, a and b trickle.
    for step in range(5):
        for agent in ("c", "b", "a"):
            if step < len(outs[agent]):
                apc.append(agent, [outs[agent][step]], [0.0], "")
                states.append(prompt.state())
            elif not apc[agent].done:
                apc.finish(agent)
                states.append(prompt.state())
    final = states[-1]
    assert final.complete and not any(s.complete for s in states[:-1])
    for s in states:
        assert final.ids[: len(s.ids)] == s.ids
    p = build_pieces(tok, AGG, "What is 2+3?")
    assert final.ids == (
        p.head
        + [300, 301, 302]
        + p.betweens[0]
        + [400, 401]
        + p.betweens[1]
        + [500, 501, 502]
        + p.tail
    )
    assert prompt.order == ["a", "b", "c"]


def _finish(apc, agent, ids):
    apc.append(agent, ids, [0.0] * len(ids), "")
    apc.finish(agent)


async def test_dynamic_order_gives_the_next_slot_to_the_first_finished(tok):
    apc = AnswerCache(["a", "b", "c"])
    prompt = make_prompt(tok, apc, slot_order="dynamic")
    apc.append("b", [400], [0.0], "")
    apc.append("c", [500, 501], [0.0, 0.0], "")
    prompt.state()
    assert prompt.order == ["c"]  # most streamed, nobody finished yet
    _finish(apc, "c", [502])
    _finish(apc, "a", [300])
    prompt.state()
    # a finished first among the rest; b, still streaming, takes the last position.
    assert prompt.order == ["c", "a", "b"]
    _finish(apc, "b", [401])
    st = prompt.state()
    assert st.complete and prompt.order == ["c", "a", "b"]


async def test_blocking_dynamic_order_is_completion_order(tok):
    apc = AnswerCache(["a", "b", "c"])
    for agent in ("b", "c", "a"):
        _finish(apc, agent, [300])
    prompt = make_prompt(tok, apc, slot_order="dynamic")
    prompt.state()
    assert prompt.order == ["b", "c", "a"]


async def test_shortest_first_commits_a_finished_answer_once_nothing_left_can_end_shorter(tok):
    apc = AnswerCache(["a", "b", "c"])
    prompt = make_prompt(tok, apc, slot_order="shortest_first")
    apc.append("a", [300, 301, 302], [0.0] * 3, "")
    _finish(apc, "c", [500, 501])
    apc.append("b", [400], [0.0], "")
    prompt.state()
    assert prompt.order == []  # b has 1 token: it may still end shorter than c's 2
    apc.append("b", [401], [0.0], "")
    prompt.state()
    assert prompt.order == []  # b has 2, as many as c, and comes first in the template
    apc.append("b", [402], [0.0], "")
    prompt.state()
    assert prompt.order == ["c"]  # nobody left can end before c now
    _finish(apc, "a", [303])
    prompt.state()
    assert prompt.order == ["c"]  # b (3 so far) may still end shorter than a's 4
    apc.append("b", [403], [0.0], "")
    st = prompt.state()
    # b has 4, as many as a but after it in the template; then b, the last left, grows.
    assert prompt.order == ["c", "a", "b"] and not st.complete
    p = build_pieces(tok, AGG, "What is 2+3?")
    head = p.head + [500, 501] + p.betweens[0] + [300, 301, 302, 303] + p.betweens[1]
    assert st.ids == head + [400, 401, 402, 403]
    _finish(apc, "b", [404])
    st = prompt.state()
    assert st.complete and st.ids == head + [400, 401, 402, 403, 404] + p.tail


async def test_blocking_shortest_first_is_by_length_then_template(tok):
    apc = AnswerCache(["a", "b", "c"])
    for agent, ids in (("a", [300, 301]), ("b", [400]), ("c", [500])):
        _finish(apc, agent, ids)
    prompt = make_prompt(tok, apc, slot_order="shortest_first")
    assert prompt.state().complete and prompt.order == ["b", "c", "a"]


async def test_forced_order_reproduces_a_prompt(tok):
    apc = AnswerCache(["a", "b", "c"])
    for agent, ids in (("a", [1000]), ("b", [2000]), ("c", [3000])):
        _finish(apc, agent, ids)
    ids = make_prompt(tok, apc, forced_order=["c", "a", "b"]).state().ids
    p = build_pieces(tok, AGG, "What is 2+3?")
    assert ids == p.head + [3000] + p.betweens[0] + [1000] + p.betweens[1] + [2000] + p.tail


async def test_dropping_the_last_slot_keeps_the_warmed_prefix(tok):
    apc = AnswerCache(["a", "b", "c"])
    dropped: set[str] = set()
    prompt = make_prompt(tok, apc, dropped)
    _finish(apc, "a", [300])
    _finish(apc, "b", [400])
    apc.append("c", [500], [0.0], "")
    before = prompt.state()
    dropped.add("c")
    after = prompt.state()
    p = build_pieces(tok, AGG, "What is 2+3?")
    assert after.complete
    assert after.ids == p.head + [300] + p.betweens[0] + [400] + p.tail
    assert before.ids[: len(after.ids) - len(p.tail)] == after.ids[: -len(p.tail)]


async def test_a_failed_precursor_fails_the_successor_by_name(tok):
    apc = AnswerCache(["a", "b", "c"])
    prompt = make_prompt(tok, apc)
    apc.fail("b", "decode request to http://x failed: HTTP 500")
    with pytest.raises(PrecursorFailed, match="precursor 'b' failed: decode request"):
        prompt.state()


def test_text_splicer_holds_back_an_unstable_tail(tok):
    text = "The answer is 42 because six times seven is forty-two, unquestionably."
    final = tok.encode(text)
    splicer = TextSplicer(tok, holdback=4)
    committed: list[int] = []
    for cut in range(1, len(text) + 1):
        ids = splicer.ids(text[:cut], done=False)
        assert len(ids) <= max(0, len(tok.encode(text[:cut])) - 4)
        committed = ids
        # Every committed prefix survives to the final tokenization of the whole text.
        assert final[: len(ids)] == ids
    assert len(committed) == len(final) - 4
    assert splicer.ids(text, done=True) == final


def test_a_question_quoting_slot_syntax_stays_text(tok):
    question = "What does <|answer:a|> mean in <|answer:zz|>?"
    pieces = build_pieces(tok, AGG, question)
    assert pieces.slots == ["a", "b", "c"] and len(pieces.betweens) == 2
    assert question in tok.tok.decode(pieces.head)


def test_gemma_end_of_turn_ids_are_its_special_tokens_only(tok):
    from sglang_ext.engine.model_store import resolve_model_path

    gemma = TokenizerStore().get(resolve_model_path("gemma3-270m"))
    # "</s>" is in Gemma's vocabulary too, but as plain text: it stays in a spliced answer.
    assert gemma.tok.convert_ids_to_tokens(sorted(gemma.eot_ids)) == ["<eos>", "<end_of_turn>"]
    assert gemma.family != tok.family
    pieces = build_pieces(gemma, AGG, "What is 2+3?")
    assert pieces.head[:2] == gemma.tok.convert_tokens_to_ids(["<bos>", "<start_of_turn>"])
    assert gemma.tok.decode(pieces.tail).endswith("<end_of_turn>\n<start_of_turn>model\n")
