"""benchmarks/gpu/dummy_cache.py: shape-only models written here for a node that cannot write them."""

from __future__ import annotations

import json

from benchmarks.gpu.dummy_cache import main, write_cache
from sglang_ext.engine.model_store import resolve_model_path


def test_the_model_store_takes_the_written_cache_as_it_is(tmp_path):
    dirs = write_cache(tmp_path, ["qwen3-8b", "qwen3-4b"])
    first, second = dirs
    tokenizer = second / "tokenizer.json"
    # Stored once: the second shape links the first's, relatively (the cache is copied elsewhere).
    assert tokenizer.is_symlink() and not tokenizer.readlink().is_absolute()
    assert tokenizer.read_bytes() == (first / "tokenizer.json").read_bytes()
    moved = tmp_path.rename(tmp_path.with_name("moved"))
    stamp = (moved / "models" / second.name / "config.json").stat().st_mtime_ns
    got = resolve_model_path("dummy:qwen3-4b", cache_dir=str(moved))
    assert got == str(moved / "models" / second.name)
    assert (
        moved / "models" / second.name / "config.json"
    ).stat().st_mtime_ns == stamp  # not rewritten
    assert (
        json.loads((moved / "models" / second.name / "config.json").read_text())["hidden_size"]
        == 2560
    )


def test_an_unknown_shape_is_named(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--shapes", "qwen3-8b,qwen9-1t"]) == 2
    err = capsys.readouterr().err
    assert "--shapes qwen9-1t: pick from" in err and "qwen3-1.7b" in err
    assert not (tmp_path / "models").exists()
