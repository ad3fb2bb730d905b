"""Gemma-3-270M (the mixed-family configs' second model) in CausalLM against transformers.

The first run converts the packaged GGUF once (~1-2 min on 2 cores, cached under
~/.cache/moa-pd). A 640-token prompt crosses Gemma's 512-token sliding window; chunked prefill
through the window is checked at 1e-4 on tiny_models' Gemma3 (an 8-token window) in
test_model_forward.py.
"""

from __future__ import annotations

import pytest
import torch
from test_model_forward import SlotPool, assert_logits_close, chat_ids, hf_logits
from transformers import AutoModelForCausalLM, AutoTokenizer

from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.model import CausalLM, make_kv_buffer
from sglang_ext.engine.model_store import resolve_model_path


@pytest.fixture(scope="module")
def gemma3():
    path = resolve_model_path("gemma3-270m")
    ours = CausalLM.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return ours, ref, tokenizer


def test_gemma3_config_and_chat_template(gemma3):
    ours, _, tokenizer = gemma3
    cfg = ours.config
    assert (cfg.model_type, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (
        "gemma3_text",
        18,
        4,
        1,
    )
    assert cfg.sliding_layers.count(False) == 3 and cfg.sliding_window == 512
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert set(cfg.eos_token_ids) == {tokenizer.eos_token_id, end_of_turn}
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n"


def test_gemma3_logits_match_transformers_past_the_window(gemma3):
    ours, ref, tokenizer = gemma3
    question = "List the prime numbers below one hundred and explain how you found them. " * 45
    ids = chat_ids(tokenizer, question)
    assert len(ids) > 600  # past the 512-token window: the local layers' masks cut in
    expected = hf_logits(ref, ids)
    kv = make_kv_buffer(ours.config, 1024, torch.float32)
    slots = SlotPool(1024).take(len(ids))
    got = ours(ForwardBatch.build([slots], [ids]), kv, all_logits=True)
    assert_logits_close(got, expected)


def test_gemma3_greedy_generation_matches_transformers(gemma3):
    ours, ref, tokenizer = gemma3
    ids = chat_ids(tokenizer, "Write a short poem about the sea.")
    with torch.inference_mode():
        expected = ref.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    expected = expected[0, len(ids) :].tolist()
    kv = make_kv_buffer(ours.config, 256, torch.float32)
    slots = SlotPool(256).take(len(ids) + 12)
    new, got = ids, []
    while len(got) < len(expected):
        logits = ours(ForwardBatch.build([slots[: len(ids) + len(got)]], [new]), kv)
        got.append(int(logits[0].argmax()))
        new = got[-1:]
    assert got == expected, tokenizer.decode(got)
