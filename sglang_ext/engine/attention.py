"""Rotary embedding and paged-KV attention for `CausalLM` (Llama, Qwen3 and Gemma3 layouts).

Each layer writes the new tokens' K/V into its slice of the KV buffer, then attends per sequence
over that sequence's gathered slots; `AttentionPlan` holds the per-sequence bookkeeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.linear import Linear, MergedLinear


class RotaryEmbedding(nn.Module):
    """cos/sin for absolute positions, computed the way transformers does (fp32, on the fly)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif rope_type != "default":
            raise NotImplementedError(f"rope_type '{rope_type}' is not supported (default, llama3)")
        self.inv_freq = inv_freq  # a plain attribute: the model is built on the meta device

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq
        # [T, 1, head_dim]: broadcast over heads
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos(), emb.sin()


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1 frequency smoothing, as transformers' _compute_llama3_parameters.
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@dataclass(slots=True)
class SeqAttention:
    start: int  # first row of this sequence's new tokens in the batch
    end: int
    slots: torch.Tensor  # KV slots of tokens 0..seq_len-1
    mask: torch.Tensor | None  # [new, seq_len] bool, None when no mask is needed
    is_causal: bool  # whole sequence is new: plain causal mask
    # Sliding-window layers' [new, seq_len] mask; None where the window reaches back to token 0
    # for every new token (then `mask`/`is_causal` apply to those layers too).
    window_mask: torch.Tensor | None = None


@dataclass(slots=True)
class AttentionPlan:
    """Per-sequence attention bookkeeping, built once per forward and shared by every layer."""

    out_slots: torch.Tensor
    seqs: list[SeqAttention]

    @classmethod
    def from_batch(cls, batch: ForwardBatch, sliding_window: int | None = None) -> AttentionPlan:
        seqs, start = [], 0
        for slots, n in zip(batch.seq_slots, batch.extend_lens):
            total = len(slots)
            mask = None
            if 1 < n < total:
                # New token i sits at position total - n + i and sees keys 0..total - n + i.
                mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=total - n)
            seq = SeqAttention(start, start + n, slots, mask, is_causal=n > 1 and n == total)
            if sliding_window is not None and total > sliding_window:
                seq.window_mask = _window_mask(n, total, sliding_window)
            seqs.append(seq)
            start += n
        return cls(batch.out_slots, seqs)


def _window_mask(n: int, total: int, window: int) -> torch.Tensor:
    # Query at position q sees key k iff q - window < k <= q (transformers' sliding overlay).
    q = torch.arange(total - n, total)[:, None]
    k = torch.arange(total)[None, :]
    return (k <= q) & (k > q - window)


class Attention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool,
        qk_norm_eps: float | None,
        norm_cls: type[nn.Module] = nn.RMSNorm,
        scale: float | None = None,
        sliding: bool = False,
        qkv_bias: bool | None = None,
    ) -> None:
        """`bias`: on q, k, v and o (Llama's attention_bias); `qkv_bias`, when given, on q, k
        and v alone (Qwen2)."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale  # None: SDPA's 1/sqrt(head_dim)
        self.sliding = sliding  # attend through the plan's window masks (Gemma3's local layers)
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = MergedLinear(
            hidden_size, [q_size, kv_size, kv_size], bias=bias if qkv_bias is None else qkv_bias
        )
        self.o_proj = Linear(q_size, hidden_size, bias=bias)
        # Qwen3 and Gemma3 normalize each head of q and k before RoPE.
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = norm_cls(head_dim, eps=qk_norm_eps)
            self.k_norm = norm_cls(head_dim, eps=qk_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        """x [T, hidden]; kv_cache: this layer's [2, num_slots, kv_heads, head_dim]."""
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.shard_sizes, dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        kv_cache[0].index_copy_(0, plan.out_slots, k.to(kv_cache.dtype))
        kv_cache[1].index_copy_(0, plan.out_slots, v.to(kv_cache.dtype))

        out = torch.empty_like(q)
        for seq in plan.seqs:
            kv = kv_cache.index_select(1, seq.slots).to(q.dtype)  # [2, seq_len, kv_heads, head_dim]
            windowed = self.sliding and seq.window_mask is not None
            out[seq.start : seq.end] = F.scaled_dot_product_attention(
                q[seq.start : seq.end].transpose(0, 1)[None],  # [1, heads, new, head_dim]
                kv[0].transpose(0, 1)[None],
                kv[1].transpose(0, 1)[None],
                attn_mask=seq.window_mask if windowed else seq.mask,
                is_causal=seq.is_causal and not windowed,
                scale=self.scale,
                enable_gqa=True,
            )[0].transpose(0, 1)
        return self.o_proj(out.view(t, -1))
