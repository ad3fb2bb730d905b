"""Gemma-3-270M (the mixed-family configs' second model) in CausalLM against transformers.

The first run converts the packaged GGUF once (~1-2 min on 2 cores, cached under
~/.cache/moa-pd). The past-the-window test narrows the sliding window of both models (same
weights) so that a short prompt crosses it; chunked prefill through the window is checked at 1e-4
on tiny_models' Gemma3 (an 8-token window) in test_model_forward.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_model_forward import REL_TOL, SlotPool, chat_ids
from transformers import AutoModelForCausalLM, AutoTokenizer

from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.model import CausalLM, make_kv_buffer
from sglang_ext.engine.model_store import resolve_model_path

# The past-the-window test's sliding window, in transformers' model and ours alike: 64 tokens
# instead of Gemma-3-270M's 512 (asserted below), so a ~190-token prompt crosses it. The masks
# take the same code path at any width, and transformers' float64 reference over 640 tokens
# was most of this file's time. Logits are compared from some positions inside the window on.
TEST_WINDOW = 64
WINDOW_EDGE = 48


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
    """Against transformers in float64 (the exact logits, to fp32's eyes): at every position
    ours are no further from them than transformers' own float32 logits are, plus the usual
    bound. Why not ours vs transformers' float32 at 1e-5 alone: a few positions of a prompt
    can be ill-conditioned (a Gemma-3 residual stream of large activations), and on an AMX CPU
    (Sapphire Rapids: this project's CI machine in stop 40) transformers' float32 was 8.1e-3 off
    the exact logits at one of them and ours 3.9e-3, so the two float32 results differed by
    4.2e-3 (4.3e-5 of the largest logit) with ours the closer. A wrong mask past the window
    would put ours off at every position past it, far beyond float32's own error."""
    ours, _, tokenizer = gemma3
    question = "List the prime numbers below one hundred and explain how you found them. " * 15
    ids = chat_ids(tokenizer, question)
    assert len(ids) > 3 * TEST_WINDOW  # well past the window: the local layers' masks cut in
    # Logits from the window's edge on: a wrong mask shows at every position past it, and the
    # 262k-vocabulary head over every position is much of the time (in float64).
    keep = torch.arange(WINDOW_EDGE, len(ids))
    ref = narrow_window_reference(torch.float32)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids]), logits_to_keep=keep).logits[0].float()
    del ref
    full_window = ours.config
    ours.config = dataclasses.replace(full_window, sliding_window=TEST_WINDOW)
    try:
        kv = make_kv_buffer(ours.config, 256, torch.float32)
        slots = SlotPool(256).take(len(ids))
        got = ours(ForwardBatch.build([slots], [ids]), kv, all_logits=True)[keep]
    finally:
        ours.config = full_window  # the module's other tests use the model as shipped
    ref64 = narrow_window_reference(torch.float64)
    with torch.inference_mode():
        exact = ref64(torch.tensor([ids]), logits_to_keep=keep).logits[0]
    ours_off = (got.double() - exact).abs().amax(dim=-1)
    fp32_off = (expected.double() - exact).abs().amax(dim=-1)
    bound = fp32_off + REL_TOL * exact.abs().max()
    worst = int((ours_off - bound).argmax())
    assert (ours_off <= bound).all(), (
        f"position {WINDOW_EDGE + worst}: ours {ours_off[worst]:.2e} off the float64 logits, transformers' "
        f"float32 {fp32_off[worst]:.2e}"
    )


def narrow_window_reference(dtype: torch.dtype):
    """transformers' Gemma-3 with TEST_WINDOW as its sliding window (the float64 one takes
    ~2 GB while it lives)."""
    return AutoModelForCausalLM.from_pretrained(
        resolve_model_path("gemma3-270m"), dtype=dtype, sliding_window=TEST_WINDOW
    ).eval()


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
