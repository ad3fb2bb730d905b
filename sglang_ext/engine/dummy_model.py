"""Shape-only model directories: a real architecture's config.json, the embedded SmolLM2 tokenizer
(with its chat template) and a placeholder safetensors file holding no tensors.

Served with `--load-format dummy` (SGLang's convention; the reference engine honours it too), such
a directory gives random weights of the real size: timings are real, outputs are not. Written by
`moa-pd dummy-model` and by the model store for a `"model_path": "dummy:SHAPE"`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# The Qwen3 dense models' published config.json values (hub configs of Qwen/Qwen3-1.7B, -4B, -8B,
# -14B, -32B; all: head_dim 128, 8 KV heads, RoPE base 1e6, 40,960 positions, a 151,936-row
# vocabulary; the smaller ones tie their embeddings), so a shape has its published parameter count.
# The SmolLM2 tokenizer's ids (< 49,152) all lie inside that vocabulary; ids it lacks decode to "".
# "qwen3-tiny" is a 2-layer model of the same family for CPU tests, whose vocabulary is the
# tokenizer's own 49,152 rows (not Qwen3's) to keep those tests fast. Special ids come from the
# tokenizer.
QWEN3_VOCAB = 151936
SMOLLM2_VOCAB = 49152
SHAPES: dict[str, dict] = {
    "qwen3-tiny": {
        "vocab_size": SMOLLM2_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "tie_word_embeddings": False,
    },
    "qwen3-1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "qwen3-4b": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
    "qwen3-14b": {
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
}
QWEN3_COMMON = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "use_sliding_window": False,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    "vocab_size": QWEN3_VOCAB,
}
# A safetensors file is an 8-byte little-endian header length and a JSON header; "{}" declares
# no tensors. SGLang's dummy loader still looks for a weights file, and an empty file is invalid.
PLACEHOLDER_NAME = "model.safetensors"
PLACEHOLDER = struct.pack("<Q", 2) + b"{}"


def check_shape(shape: str) -> dict:
    """The shape's hyper-parameters, or a ValueError naming the known shapes."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape '{shape}': use one of {', '.join(SHAPES)}")
    return SHAPES[shape]


def hf_config(shape: str, tokenizer) -> dict:
    """config.json of `shape` (its own vocabulary size), with the special ids of `tokenizer`."""
    hp = {**QWEN3_COMMON, **check_shape(shape)}
    if hp["vocab_size"] < len(tokenizer):
        raise ValueError(
            f"shape '{shape}' has {hp['vocab_size']} vocabulary rows, fewer than the tokenizer's "
            f"{len(tokenizer)}: its token ids would fall outside the embedding"
        )
    return {
        **hp,
        "max_window_layers": hp["num_hidden_layers"],
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def is_current(shape: str, model_dir: Path) -> bool:
    """Whether model_dir's config.json has every hyper-parameter `shape` has now (a directory
    written by an older release, e.g. with the tokenizer's 49k vocabulary, is not)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return all(config.get(k) == v for k, v in {**QWEN3_COMMON, **check_shape(shape)}.items())


def write_dummy_model(shape: str, out_dir: Path, tokenizer_dir: str | Path) -> Path:
    """Write a shape-only HF directory for `shape` into out_dir (created if missing), with the
    tokenizer of tokenizer_dir: the SmolLM2 directory, which the model store resolves
    (`model_store.resolve_model_path("smollm2-135m")`)."""
    from transformers import AutoTokenizer

    check_shape(shape)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = hf_config(shape, tokenizer)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / PLACEHOLDER_NAME).write_bytes(PLACEHOLDER)
    return out_dir
