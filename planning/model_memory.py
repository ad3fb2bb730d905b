"""A model's memory from its config.json: weights (parameters × dtype bytes) and KV bytes per token.

Parameters are counted by building the model on torch's meta device, so every architecture
transformers knows is counted exactly (tied embeddings once) with no hand formula per family.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


class ModelConfigError(ValueError):
    """A model whose config.json cannot be found or read; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class ModelMemory:
    parameters: int
    weights_bytes: int
    kv_bytes_per_token: int
    dtype: str
    kv_dtype: str


def config_dir(model_path: str) -> Path:
    """The directory holding the model's config.json: a local directory, or an HF id's snapshot
    in the local HF cache (GPU nodes often reach no hub, so nothing is downloaded here)."""
    local = Path(model_path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelConfigError(f"model directory '{local}' has no config.json")
        return local
    if model_path.startswith(("/", ".", "~")):
        raise ModelConfigError(f"model path '{model_path}' does not exist")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(model_path, "config.json")
    if isinstance(cached, str):
        return Path(cached).parent
    from sglang_ext.engine.model_store import resolve_model_path

    try:  # an embedded model's name ("smollm2-135m"), converted once into the local cache
        return Path(resolve_model_path(model_path))
    except (FileNotFoundError, ValueError):
        pass
    raise ModelConfigError(
        f"model '{model_path}' is an HF id whose config.json is not in the local HF cache, so "
        f"its memory cannot be planned: run `huggingface-cli download {model_path} config.json` "
        "where a hub is reachable, or give a local model directory"
    )


def _dtype_name(value: object) -> str:
    name = str(value).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ModelConfigError(f"unknown dtype '{value}'; known: {', '.join(DTYPE_BYTES)}")
    return name


@functools.lru_cache(maxsize=32)
def count_parameters(model_dir: str) -> int:
    """Parameters of the model in model_dir, built on the meta device (no memory, no weights)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
    )

    cfg = AutoConfig.from_pretrained(model_dir)
    # A vision-language model (e.g. Qwen3-VL) is no causal LM to transformers; SGLang loads its
    # vision tower too, so its own class counts it.
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText, AutoModel):
        try:
            with torch.device("meta"):
                model = auto.from_config(cfg)
        except ValueError:
            continue
        return sum(p.numel() for p in model.parameters())
    raise ModelConfigError(f"transformers cannot build the model in {model_dir} ({cfg.model_type})")


def model_memory(model_path: str, dtype: str = "auto", kv_cache_dtype: str = "auto") -> ModelMemory:
    """Weights and KV bytes/token of the model at model_path (a local dir or a cached HF id).

    dtype / kv_cache_dtype: SGLang's flags of the same name ("auto": the config's dtype; a
    float32 checkpoint is served in bfloat16, as SGLang does on a GPU)."""
    directory = config_dir(model_path)
    raw = json.loads((directory / "config.json").read_text())
    text = raw.get("text_config") or raw
    if dtype == "auto":
        dtype = text.get("dtype") or text.get("torch_dtype") or raw.get("torch_dtype") or "bfloat16"
        dtype = "bfloat16" if _dtype_name(dtype) == "float32" else dtype
    dtype = _dtype_name(dtype)
    kv_dtype = dtype if kv_cache_dtype == "auto" else _dtype_name(kv_cache_dtype)
    try:
        layers = text["num_hidden_layers"]
        heads = text["num_attention_heads"]
        kv_heads = text.get("num_key_value_heads") or heads
        head_dim = text.get("head_dim") or text["hidden_size"] // heads
    except KeyError as e:
        raise ModelConfigError(f"{directory / 'config.json'} has no {e.args[0]}") from None
    # K and V of every layer. This ignores what makes a model's pool smaller per token:
    # sliding-window layers (Gemma 3's local layers, which SGLang may pool apart), MLA's
    # compressed KV (DeepSeek), linear-attention/mamba layers (Qwen3-Next) -- so it over-estimates
    # those models, never under-estimates. Quantized weights are counted at `dtype` (also over).
    kv = 2 * layers * kv_heads * head_dim * DTYPE_BYTES[kv_dtype]
    params = count_parameters(str(directory))
    return ModelMemory(params, params * DTYPE_BYTES[dtype], kv, dtype, kv_dtype)
