"""CausalLM: the Llama-family (SmolLM2, Llama 3), Qwen2, Qwen3 and Gemma3 decoders over a paged
KV buffer.

The engine's model runner calls `CausalLM.from_pretrained` once and `forward` every step, with
prefills and decodes of many sequences concatenated in one `ForwardBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglang_ext import protocol as P
from sglang_ext.engine.attention import Attention, AttentionPlan, RotaryEmbedding
from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.gemma3 import Gemma3DecoderLayer, GemmaRMSNorm
from sglang_ext.engine.linear import GatedMLP, Linear
from sglang_ext.engine.weights import init_dummy_weights, load_weights, read_hf_config

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma3_text")
GEMMA3 = "gemma3_text"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # HF rope parameters when rope_type is not "default"
    max_position: int
    attention_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm on each head of q and k
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype
    # Gemma3 only (None/empty for Llama and Qwen3): which layers attend through a sliding window,
    # its width, those layers' RoPE base, the attention and embedding scales, the logit softcap.
    sliding_layers: tuple[bool, ...] = ()
    sliding_window: int | None = None
    local_rope_theta: float | None = None
    attn_scale: float | None = None
    embed_scale: float | None = None
    final_logit_softcap: float | None = None
    qkv_bias: bool = False  # Qwen2: biases on q, k and v only (Llama's attention_bias: all four)

    @classmethod
    def from_hf(cls, hf: dict, dtype: torch.dtype = torch.float32) -> ModelConfig:
        """Build from an HF config.json dict (transformers 4.x `rope_scaling` or 5.x `rope_parameters`)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type '{model_type}' is not supported: use {SUPPORTED_MODEL_TYPES}"
            )
        if model_type == "qwen2" and hf.get("use_sliding_window"):
            raise ValueError("Qwen2 with use_sliding_window is not supported (full attention)")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        gemma = _gemma3_fields(hf, rope) if model_type == GEMMA3 else {}
        if gemma:
            rope = rope.get("full_attention") or {"rope_theta": hf.get("rope_theta", 1e6)}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        eos = hf.get("eos_token_id")
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            rms_norm_eps=hf["rms_norm_eps"],
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            rope_scaling=dict(rope) if rope_type != "default" else None,
            max_position=hf["max_position_embeddings"],
            attention_bias=hf.get("attention_bias", False),
            qk_norm=model_type in ("qwen3", GEMMA3),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=tuple(dict.fromkeys(eos)),  # dedupe, keep order
            dtype=dtype,
            qkv_bias=model_type == "qwen2" or hf.get("attention_bias", False),
            **gemma,
        )


def _gemma3_fields(hf: dict, rope: dict) -> dict:
    """Gemma3's extra fields, from a transformers 5.x (`layer_types`, per-type `rope_parameters`)
    or 4.x (`sliding_window_pattern`, `rope_local_base_freq`) config.json."""
    if hf.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping is not supported (Gemma2-style checkpoints)")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention is not supported (an embedding model?)")
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % hf.get("sliding_window_pattern", 6) == 0 else "sliding"
        for i in range(n)
    ]
    local = rope.get("sliding_attention") or {}
    local_type = local.get("rope_type", "default")
    if local_type != "default":
        raise ValueError(f"sliding layers' rope_type '{local_type}' is not supported (default)")
    return {
        "sliding_layers": tuple(t != "full_attention" for t in types),
        "sliding_window": hf["sliding_window"],
        "local_rope_theta": local.get("rope_theta", hf.get("rope_local_base_freq", 10000.0)),
        "attn_scale": hf.get("query_pre_attn_scalar", 256) ** -0.5,
        "embed_scale": hf["hidden_size"] ** 0.5,
        "final_logit_softcap": hf.get("final_logit_softcapping"),
    }


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.attention_bias,
            qk_norm_eps=cfg.rms_norm_eps if cfg.qk_norm else None,
            qkv_bias=cfg.qkv_bias,
        )
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, h, cos, sin, kv_cache, plan: AttentionPlan) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, plan)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # Built on the meta device (CausalLM), but Embedding's own random init would still run
        # there through torch's Python reference ops, importing torch._dynamo: ~0.5 s of every
        # worker start. A given (empty) weight skips that init; the checkpoint fills it.
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        if cfg.model_type == GEMMA3:
            self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, s) for s in cfg.sliding_layers)
            self.norm = GemmaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        else:
            self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
            self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


def _materialize_on_cpu(module: nn.Module) -> None:
    """`module.to_empty(device="cpu")` for its meta tensors, without `empty_like` on them: torch
    runs that through its Python reference ops, which import sympy (~0.6 s of each start)."""
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            if param.is_meta:
                empty = torch.empty(param.shape, dtype=param.dtype)
                setattr(sub, name, nn.Parameter(empty, requires_grad=param.requires_grad))
        for name, buffer in list(sub.named_buffers(recurse=False)):
            if buffer.is_meta:
                setattr(sub, name, torch.empty(buffer.shape, dtype=buffer.dtype))


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.local_rotary = None  # Gemma3's sliding layers use their own RoPE base
        if config.local_rope_theta is not None:
            self.local_rotary = RotaryEmbedding(config.head_dim, config.local_rope_theta, None)
        with torch.device("meta"):  # no random init: every weight comes from the checkpoint
            self.model = DecoderModel(config)
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        _materialize_on_cpu(self)
        self.to(config.dtype)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        dtype: torch.dtype = torch.float32,
        load_format: str = "auto",
        pack_projections: bool = True,
    ) -> CausalLM:
        """Load an HF directory (see `model_store.resolve_model_path` for names); load_format
        "dummy" (SGLang's name) reads only config.json and fills seeded random weights.
        `pack_projections=False` packs the lm_head only, leaving the layers to MKL as before
        stop 38 (batch-variant; benchmarks/bench_projections.py compares the two)."""
        hf = read_hf_config(path)
        model = cls(ModelConfig.from_hf(hf, dtype))
        if load_format == P.LOAD_FORMAT_DUMMY:
            init_dummy_weights(model, std=hf.get("initializer_range", 0.02))
        else:
            load_weights(model, path, tied_lm_head=model.config.tie_word_embeddings)
        model.requires_grad_(False)
        for module in model.modules():  # every projection, for batch invariance: see linear.py
            if isinstance(module, Linear) and (pack_projections or module is model.lm_head):
                tied = module is model.lm_head and model.config.tie_word_embeddings
                module.pack(keep_dense=tied)
        return model.eval()

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, kv_buffer: torch.Tensor, all_logits: bool = False
    ) -> torch.Tensor:
        """Write the new tokens' K/V into `kv_buffer` and return float32 logits.

        Logits are [num_seqs, vocab] for each sequence's last new token, or [T, vocab].
        """
        cfg = self.config
        plan = AttentionPlan.from_batch(batch, cfg.sliding_window)
        rope = {False: tuple(x.to(cfg.dtype) for x in self.rotary(batch.positions))}
        if self.local_rotary is not None:
            rope[True] = tuple(x.to(cfg.dtype) for x in self.local_rotary(batch.positions))
        h = self.model.embed_tokens(batch.input_ids)
        if cfg.embed_scale is not None:  # Gemma: scaled as a tensor of the model's dtype
            h = h * torch.tensor(cfg.embed_scale, dtype=h.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_buffer):
            cos, sin = rope[getattr(layer, "sliding", False)]
            h = layer(h, cos, sin, kv_cache, plan)
        if not all_logits:
            h = h[torch.tensor([seq.end - 1 for seq in plan.seqs], dtype=torch.long)]
        logits = self.lm_head(self.model.norm(h)).float()
        if cfg.final_logit_softcap is not None:
            cap = cfg.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits


def make_kv_buffer(config: ModelConfig, num_slots: int, dtype: torch.dtype) -> torch.Tensor:
    """One contiguous [num_layers, 2, num_slots, kv_heads, head_dim] tensor (one NIXL region).

    Slot = page * page_size + offset; the KV pool decides pages, the model sees only slots.
    """
    shape = (config.num_layers, 2, num_slots, config.num_kv_heads, config.head_dim)
    return torch.zeros(shape, dtype=dtype)
