"""Tiny random-weight HF model directories (Llama, Llama with llama3 RoPE, Qwen2, Qwen3, Gemma3)
for tests.

Each carries the SmolLM2 tokenizer and chat template, so engine and server tests can send text.
Built once per test process into a temp dir (`tiny_model_dir(kind)`), removed at exit.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from sglang_ext.engine.model_store import resolve_model_path

KINDS = ("llama", "llama3-rope", "qwen2", "qwen3", "gemma3")

# SmolLM2's special ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (end of a chat turn).
COMMON = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # GQA, 2 query heads per KV head
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    # Larger than the usual 0.02 so attention is far from uniform and logits spread widely:
    # a RoPE or masking bug then moves logits by much more than the 1e-4 tolerance.
    "initializer_range": 0.2,
}


def _build(kind: str) -> torch.nn.Module:
    if kind == "llama":  # SmolLM2's layout: tied embeddings, default RoPE
        config = LlamaConfig(**COMMON, tie_word_embeddings=True, rope_theta=100000.0)
        return LlamaForCausalLM(config)
    if kind == "llama3-rope":  # Llama 3.2's RoPE scaling, untied head
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,  # small, so the test positions get smoothed
        }
        config = LlamaConfig(**COMMON, tie_word_embeddings=False, rope_parameters=rope)
        return LlamaForCausalLM(config)
    if kind == "qwen2":  # q/k/v biases (not o); tied embeddings, as Qwen2.5-0.5B
        config = Qwen2Config(**COMMON, tie_word_embeddings=True, rope_theta=1e6)
        return Qwen2ForCausalLM(config)
    if kind == "qwen3":  # q/k norms; head_dim * heads != hidden_size
        config = Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False, rope_theta=1e6)
        return Qwen3ForCausalLM(config)
    if kind == "gemma3":
        # A window of 8 so the tests' 9-45 token sequences cross it; the attention scale
        # (query_pre_attn_scalar) differs from 1/sqrt(head_dim); local and global RoPE bases differ.
        config = Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 3},
            head_dim=32,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=24,
            final_logit_softcapping=30.0,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
            tie_word_embeddings=True,
        )
        return Gemma3ForCausalLM(config)
    raise ValueError(f"unknown tiny model kind '{kind}': use one of {KINDS}")


@functools.cache
def _session_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="moa-pd-tiny-models-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def tiny_model_dir(kind: str = "llama") -> str:
    """Path of an HF dir (fp32 safetensors + SmolLM2 tokenizer) holding a tiny random `kind` model."""
    out = _session_dir() / kind
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    with torch.random.fork_rng():
        torch.manual_seed(KINDS.index(kind) if kind in KINDS else 0)
        model = _build(kind)
        # RMSNorm weights start at 1 and biases at 0: jitter them so a norm applied to the
        # wrong axis, or a bias dropped or misplaced, shows.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name or name.endswith(".bias"):
                    param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)
