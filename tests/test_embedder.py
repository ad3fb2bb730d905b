"""The bundled MiniLM embedder, offline, and the Q metric on its real embeddings."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from router.config import EarlyExit
from router.early_exit import AgentResult, decide, fcs, self_norm, unit_columns
from router.embedder import Embedder, resolve_model_path

ANSWERS = [
    "Natalia sold 48 clips in April and half as many, 24, in May. 48 + 24 = 72. The answer is 72.",
    "In April she sold 48. In May she sold 48 / 2 = 24 clips. Altogether 48 + 24 = 72 clips.",
    "The capital of France is Paris, a city on the Seine known for the Eiffel Tower and museums.",
]


@pytest.fixture(scope="module")
def embedder():
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    e = Embedder("all-minilm-l6-v2")
    e.load()
    yield e
    e.close()
    mp.undo()


def ref_fcs(t_i: np.ndarray, t_j: np.ndarray) -> float:
    def corr(t):
        u = t.astype(np.float64).T @ t.astype(np.float64)
        d = np.sqrt(np.maximum(np.diag(u), 1e-24))
        return u / np.outer(d, d)

    a, b = corr(t_i), corr(t_j)
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_resolve_names(tmp_path):
    assert (resolve_model_path("all-MiniLM-L6-v2") / "config.json").is_file()
    with pytest.raises(ValueError, match="local model directory"):
        resolve_model_path(str(tmp_path / "Qwen3-Embedding-4B"))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == tmp_path


def test_shapes(embedder):
    t = embedder.embed(ANSWERS[0])
    n_tokens = len(embedder._tokenizer(ANSWERS[0])["input_ids"])
    assert t.shape == (n_tokens, 384) and t.dtype == np.float32
    assert embedder.hidden_size == 384
    batch = embedder.embed_many(ANSWERS)
    assert [b.shape[0] for b in batch] == [
        len(embedder._tokenizer(a)["input_ids"]) for a in ANSWERS
    ]
    np.testing.assert_allclose(batch[0], t, atol=1e-4)  # padding does not leak into the rows
    long = embedder.embed("word " * 2000)
    assert long.shape == (embedder.max_tokens, 384)


async def test_aembed_keeps_the_loop_free(embedder):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    t = await embedder.aembed("word " * 400)
    task.cancel()
    assert t.shape[1] == 384 and ticks > 1
    many = await embedder.aembed_many(ANSWERS[:2])
    assert len(many) == 2


def test_q_on_real_embeddings(embedder):
    embs = embedder.embed_many(ANSWERS)
    s = [unit_columns(t) for t in embs]
    sims = {}
    for i, j in [(0, 0), (0, 1), (0, 2), (1, 2)]:
        sims[i, j] = fcs(s[i], s[j], self_norm(s[i]), self_norm(s[j]))
        assert sims[i, j] == pytest.approx(ref_fcs(embs[i], embs[j]), rel=1e-6)
    assert sims[0, 0] == pytest.approx(1.0)
    assert 0.0 < sims[0, 2] < 1.0 and 0.0 < sims[1, 2] < 1.0

    logprobs = [[-0.05] * 30, [-0.2] * 25, [-0.4] * 20]
    done = [AgentResult(f"a{i}", lp, t) for i, (lp, t) in enumerate(zip(logprobs, embs))]
    d = decide("agg", done, ["a0", "a1", "a2", "a3"], EarlyExit(enabled=True), "gsm8k-0")
    c = [math.exp(lp[0]) for lp in logprobs]
    pairs = [(i, j) for i in range(3) for j in range(i + 1)]
    sim = {(i, j): 1.0 if i == j else ref_fcs(embs[i], embs[j]) for i, j in pairs}
    p = sum(c[i] * c[j] * sim[i, j] for i, j in pairs) / sum(c[i] * c[j] for i, j in pairs)
    assert d.p == pytest.approx(p, rel=1e-6)
    assert d.b == pytest.approx(1 - abs(p - 0.7) / 0.7, rel=1e-6)
