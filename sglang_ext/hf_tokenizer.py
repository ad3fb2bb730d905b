"""Loads an HF tokenizer directory without `AutoTokenizer` where that gives the same tokenizer.

`AutoTokenizer.from_pretrained` builds the model's config (`AutoConfig`) to choose the class,
and that import chain pulls in torch and transformers' modeling helpers: ~2.3 s of CPU at each
start of a shell router (which otherwise never needs torch) and ~1 s of each engine worker's
start, on the 2-core machines this project targets. The class it chooses depends on the pair
(`tokenizer_class` in tokenizer_config.json, `model_type` in config.json) through rules that
change between transformers releases (hub classes known wrong for some model types, LlamaTokenizer
over a ByteLevel tokenizer.json, ...). So the class named in tokenizer_config.json is loaded
directly only for the pairs in `SAME_AS_AUTO`, each checked against `AutoTokenizer` by
tests/test_hf_tokenizer.py (class, vocabulary, encodings, decodings, chat template); every other
directory goes through `AutoTokenizer` as before.
"""

from __future__ import annotations

import json
from pathlib import Path

# (tokenizer_class, model_type) pairs for which AutoTokenizer (transformers 5) loads exactly
# the named class from tokenizer.json: the hub class wins for these model types.
SAME_AS_AUTO: frozenset[tuple[str, str]] = frozenset(
    {
        ("TokenizersBackend", "llama"),  # SmolLM2, the tiny test Llamas
        ("PreTrainedTokenizerFast", "llama"),  # Llama 3.x
        ("TokenizersBackend", "qwen3"),  # the weight-free dummy:qwen3-* shapes
        ("Qwen2Tokenizer", "qwen2"),  # Qwen2.5(-Coder)
        ("Qwen2Tokenizer", "qwen3"),  # Qwen3
        ("GemmaTokenizer", "gemma3_text"),  # Gemma-3-270M (and 1B)
    }
)


def direct_class_name(path: str | Path) -> str | None:
    """The tokenizer class to load directly for the HF directory `path`, or None where
    AutoTokenizer must choose (a pair outside SAME_AS_AUTO, custom code, no tokenizer.json)."""
    folder = Path(path)
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    name = tokenizer_config.get("tokenizer_class")
    if "auto_map" in tokenizer_config or not (folder / "tokenizer.json").is_file():
        return None
    return name if (name, model_type) in SAME_AS_AUTO else None


def load_tokenizer(path: str | Path, **kwargs):
    """The tokenizer of the HF directory `path`, as `AutoTokenizer.from_pretrained` loads it."""
    import transformers

    name = direct_class_name(path)
    if name is None:
        return transformers.AutoTokenizer.from_pretrained(str(path), **kwargs)
    return getattr(transformers, name).from_pretrained(str(path), **kwargs)
