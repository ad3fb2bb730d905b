"""sglang_ext/hf_tokenizer.py loads the same tokenizer as AutoTokenizer for every
(tokenizer_class, model_type) pair it loads directly, and spares the shell router torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from sglang_ext.engine.model_store import resolve_model_path
from sglang_ext.hf_tokenizer import SAME_AS_AUTO, direct_class_name, load_tokenizer

TEXTS = [
    "Hello world",
    "  leading spaces\tand\ttabs\n\nnewlines ",
    "Ünïcödé — ελληνικά 中文 🙂",
    "<|im_end|> </s> <end_of_turn> <eos> <|endoftext|>",
    "def f(x):\n    return x**2  # café",
    "12345 + 678 = ?",
    "",
]
CHATS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7*8?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
]
# The shipped model each pair is made from: a copy of its tokenizer files with the pair written
# into the JSON (Llama 3 and Qwen3 themselves are on GPU nodes, not here).
# Gemma's tokenizer takes ~5 s to load here (a 33 MB tokenizer.json), so one Gemma pair only.
SOURCES = {
    ("TokenizersBackend", "llama"): "smollm2-135m",
    ("PreTrainedTokenizerFast", "llama"): "smollm2-135m",
    ("TokenizersBackend", "qwen3"): "dummy:qwen3-tiny",
    ("Qwen2Tokenizer", "qwen2"): "qwen2.5-coder-0.5b",
    ("Qwen2Tokenizer", "qwen3"): "qwen2.5-coder-0.5b",
    ("GemmaTokenizer", "gemma3_text"): "gemma3-270m",
}


def _tokenizer_dir(tmp_path: Path, model: str, tokenizer_class: str, model_type: str) -> Path:
    """The tokenizer files of `model` and its config.json, with the pair written into them."""
    src = Path(resolve_model_path(model))
    out = tmp_path / f"{tokenizer_class}-{model_type}"
    out.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors" and f.is_file():
            shutil.copy(f, out / f.name)
    for name, key, value in (
        ("tokenizer_config.json", "tokenizer_class", tokenizer_class),
        ("config.json", "model_type", model_type),
    ):
        raw = json.loads((out / name).read_text())
        raw[key] = value
        (out / name).write_text(json.dumps(raw))
    return out


def _behaviour(tok) -> dict:
    return {
        "class": type(tok).__name__,
        "vocab": tok.get_vocab(),
        "eos": tok.eos_token_id,
        "added": {i: (t.content, t.special) for i, t in tok.added_tokens_decoder.items()},
        "encode": [tok.encode(t, add_special_tokens=False) for t in TEXTS],
        "encode_special": [tok.encode(t) for t in TEXTS],
        "decode": [
            tok.decode(tok.encode(t, add_special_tokens=False), skip_special_tokens=True)
            for t in TEXTS
        ],
        "chat": [
            tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS
        ],
    }


def test_every_direct_pair_is_checked_here():
    assert set(SOURCES) == SAME_AS_AUTO


@pytest.mark.parametrize("pair", sorted(SAME_AS_AUTO), ids="-".join)
def test_direct_load_equals_auto_tokenizer(pair, tmp_path):
    folder = _tokenizer_dir(tmp_path, SOURCES[pair], *pair)
    assert direct_class_name(folder) == pair[0]
    direct = _behaviour(load_tokenizer(folder))
    auto = _behaviour(AutoTokenizer.from_pretrained(str(folder)))
    for key in auto:
        assert direct[key] == auto[key], f"{pair}: {key} differs from AutoTokenizer's"


def test_other_directories_go_through_auto_tokenizer(tmp_path):
    # Qwen2's hub class is overridden by AutoTokenizer (a model type with known-wrong hub
    # classes), custom code needs AutoTokenizer's auto_map, and a slow-only folder its converters.
    overridden = _tokenizer_dir(tmp_path, "smollm2-135m", "TokenizersBackend", "qwen2")
    assert direct_class_name(overridden) is None
    assert type(load_tokenizer(overridden)).__name__ == "Qwen2Tokenizer"  # AutoTokenizer's choice
    custom = _tokenizer_dir(tmp_path, "smollm2-135m", "TokenizersBackend", "llama")
    raw = json.loads((custom / "tokenizer_config.json").read_text())
    (custom / "tokenizer_config.json").write_text(json.dumps({**raw, "auto_map": {}}))
    assert direct_class_name(custom) is None
    (custom / "tokenizer_config.json").write_text(json.dumps(raw))
    (custom / "tokenizer.json").unlink()
    assert direct_class_name(custom) is None
    assert direct_class_name(tmp_path / "nowhere") is None


def test_the_shell_router_loads_a_tokenizer_without_torch():
    smollm2 = resolve_model_path("smollm2-135m")
    code = (
        "import sys, router.__main__, router.server\n"
        "from router.tokenizers import TokenizerStore\n"
        f"TokenizerStore().get({smollm2!r})\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
