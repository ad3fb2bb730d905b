"""The query's embedding as the scorer reads it: the embedded MiniLM's per-token last hidden
states (router/embedder.py), mean-pooled and scaled to unit length (sentence-transformers'
pooling for all-MiniLM-L6-v2). Training (`moa-pd train-scorer`) must embed the same way."""

from __future__ import annotations

import numpy as np


def query_vector(token_states: np.ndarray) -> np.ndarray:
    """[n_tokens, hidden] → [hidden], mean-pooled, unit length (zeros for an empty text)."""
    t = np.asarray(token_states, dtype=np.float64)
    if t.ndim != 2 or t.shape[0] == 0:
        return np.zeros(t.shape[-1] if t.ndim == 2 else 0)
    v = t.mean(axis=0)
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v
