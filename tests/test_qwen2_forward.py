"""Qwen2.5-Coder-0.5B-Instruct (the routing pool's third model family) in CausalLM against
transformers: its config and chat template, logits on a chat prompt, greedy tokens.

The first run joins the six packaged GGUF chunks and converts them once (cached under
~/.cache/moa-pd); Qwen2's q/k/v biases are also checked at 1e-4 on tiny_models' Qwen2 in
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
def qwen2():
    path = resolve_model_path("qwen2.5-coder-0.5b")
    ours = CausalLM.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return ours, ref, tokenizer


def test_qwen2_config_and_chat_template(qwen2):
    ours, _, tokenizer = qwen2
    cfg = ours.config
    assert (cfg.model_type, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == ("qwen2", 24, 14, 2)
    assert cfg.qkv_bias and not cfg.attention_bias  # biases on q, k, v only
    assert ours.model.layers[0].self_attn.o_proj.bias is None
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in cfg.eos_token_ids
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_qwen2_logits_and_greedy_tokens_match_transformers(qwen2):
    ours, ref, tokenizer = qwen2
    ids = chat_ids(tokenizer, "What is 17 times 23? Answer with the number.")
    expected = hf_logits(ref, ids)
    kv = make_kv_buffer(ours.config, 256, torch.float32)
    slots = SlotPool(256).take(len(ids) + 4)
    # Compared with the untied lm_head packed for oneDNN (linear.py keeps no dense copy of it):
    # 4.2e-5 here.
    got = ours(ForwardBatch.build([slots[: len(ids)]], [ids]), kv, all_logits=True)
    assert_logits_close(got, expected)
    with torch.inference_mode():
        want = ref.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    want = want[0, len(ids) :].tolist()
    kv.zero_()
    new, tokens = ids, []
    while len(tokens) < len(want):
        logits = ours(ForwardBatch.build([slots[: len(ids) + len(tokens)]], [new]), kv)
        tokens.append(int(logits[0].argmax()))
        new = tokens[-1:]
    assert tokens == want, tokenizer.decode(tokens)
