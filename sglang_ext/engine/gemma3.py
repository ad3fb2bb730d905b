"""Gemma3's decoder layer and norm, used by `CausalLM` when config.json says `gemma3_text`.

What sets Gemma3 apart from the Llama layout in model.py: an RMSNorm that scales by (1 + w) in
fp32; "sandwich" norms (after attention and after the MLP as well as before each); a GELU-tanh
MLP; q/k norms; five sliding-window layers (local RoPE base) to one global layer (global base).
The embedding scale by sqrt(hidden) and the optional final logit softcap live in `CausalLM`.
Checked against transformers' Gemma3ForCausalLM by tests/test_gemma3_forward.py.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ext.engine.attention import Attention, AttentionPlan
from sglang_ext.engine.linear import GatedMLP


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), computed in fp32 and cast back, as Gemma's checkpoints expect."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg, sliding: bool) -> None:
        super().__init__()
        self.sliding = sliding  # CausalLM picks the local or global RoPE table by this
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.attention_bias,
            qk_norm_eps=cfg.rms_norm_eps,
            norm_cls=GemmaRMSNorm,
            scale=cfg.attn_scale,
            sliding=sliding,
        )
        self.mlp = GatedMLP(
            cfg.hidden_size, cfg.intermediate_size, act=partial(F.gelu, approximate="tanh")
        )
        eps = cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)

    def forward(self, h, cos, sin, kv_cache, plan: AttentionPlan) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, plan)
        h = h + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(h))
        return h + self.post_feedforward_layernorm(mlp)
