"""The query embedding the scorer reads: the embedded MiniLM's token states of the question
prompt, mean-pooled and L2-normalized (the pooling sentence-transformers uses for
all-MiniLM-L6-v2; texts are cut at router/embedder.py's 512 tokens, not its 256).
Training (`moa-pd train-scorer`) and the router's routing decision must both embed this way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.embedder import Embedder

BATCH = 32  # questions per forward pass: padding waste stays small, memory too


def pool_tokens(tokens: np.ndarray) -> np.ndarray:
    """[n_tokens, hidden] → [hidden]: the mean, scaled to unit length (zeros for no tokens)."""
    if tokens.shape[0] == 0:
        return np.zeros(tokens.shape[1], np.float32)
    mean = tokens.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    return mean / norm if norm > 0 else mean


def query_embeddings(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """[len(texts), hidden] float32, one pooled embedding per question prompt."""
    rows = []
    for i in range(0, len(texts), BATCH):
        rows += [pool_tokens(t) for t in embedder.embed_many(texts[i : i + BATCH])]
    return np.asarray(rows, dtype=np.float32).reshape(len(texts), -1)
