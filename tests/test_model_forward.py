"""CausalLM over the paged KV buffer against transformers: tiny random models and SmolLM2-135M."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from tiny_models import KINDS, tiny_model_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.model import CausalLM, make_kv_buffer
from sglang_ext.engine.model_store import resolve_model_path

# Our projections run on oneDNN's packed kernel (batch-invariant, linear.py), transformers' on
# MKL: the same fp32 products summed in another order. The gap grows with the logits' scale
# (SmolLM2's reach ~30, Gemma3's more), so it is bounded relative to the largest logit.
REL_TOL = 1e-5


def assert_logits_close(got: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    gap, scale = (got - expected).abs().max().item(), expected.abs().max().item()
    assert gap <= REL_TOL * scale, f"{what} logits off by {gap:.2e} (scale {scale:.1f})"


NUM_SLOTS = 512


class SlotPool:
    """Hands out KV slots in shuffled order, so no sequence sits in a contiguous range."""

    def __init__(self, num_slots: int, seed: int = 0) -> None:
        self.free = list(range(num_slots))
        random.Random(seed).shuffle(self.free)

    def take(self, n: int) -> list[int]:
        taken, self.free = self.free[:n], self.free[n:]
        return taken


@pytest.fixture(scope="module", params=KINDS)
def pair(request):
    path = tiny_model_dir(request.param)
    ours = CausalLM.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ours, ref


def hf_logits(ref, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return ref(torch.tensor([ids])).logits[0].float()


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_full_prefill(pair):
    ours, ref = pair
    ids = random_ids(37, seed=1)
    kv = make_kv_buffer(ours.config, NUM_SLOTS, torch.float32)
    slots = SlotPool(NUM_SLOTS).take(len(ids))
    expected = hf_logits(ref, ids)
    assert expected.std() > 0.5  # the tiny model is not near-uniform: the tolerance means something
    got = ours(ForwardBatch.build([slots], [ids]), kv, all_logits=True)
    assert got.shape == expected.shape
    assert_logits_close(got, expected)
    last = ours(ForwardBatch.build([slots], [ids]), kv)
    assert last.shape == (1, ours.config.vocab_size)
    assert_logits_close(last[0], expected[-1])


def test_chunked_extension_through_paged_kv(pair):
    ours, ref = pair
    ids = random_ids(45, seed=2)
    expected = hf_logits(ref, ids)
    kv = make_kv_buffer(ours.config, NUM_SLOTS, torch.float32)
    pool = SlotPool(NUM_SLOTS, seed=3)
    pool.take(100)  # start somewhere in the middle of the buffer
    slots = pool.take(len(ids))
    done = 0
    for chunk in (11, 16, 1, 9, 1, 7):  # prefix, then chunks and single-token decodes
        got = ours(
            ForwardBatch.build([slots[: done + chunk]], [ids[done : done + chunk]]),
            kv,
            all_logits=True,
        )
        assert_logits_close(got, expected[done : done + chunk], f"chunk at {done}")
        done += chunk
    assert done == len(ids)


def test_mixed_batch_of_prefills_and_decodes(pair):
    ours, ref = pair
    kv = make_kv_buffer(ours.config, NUM_SLOTS, torch.float32)
    pool = SlotPool(NUM_SLOTS, seed=4)
    # (total length, cached length): two prefills with different cached prefixes, three decodes.
    shapes = [(23, 0), (30, 12), (9, 8), (40, 39), (2, 1)]
    seqs = [random_ids(total, seed=10 + i) for i, (total, _) in enumerate(shapes)]
    slots = [pool.take(total) for total, _ in shapes]
    for ids, slot, (_, cached) in zip(seqs, slots, shapes):
        if cached:  # fill the cached prefix one sequence at a time
            ours(ForwardBatch.build([slot[:cached]], [ids[:cached]]), kv)
    batch = ForwardBatch.build(slots, [ids[cached:] for ids, (_, cached) in zip(seqs, shapes)])
    assert batch.extend_lens == [23, 18, 1, 1, 1]
    all_rows = ours(batch, kv, all_logits=True)
    last_rows = ours(batch, kv)  # rewriting the same K/V is harmless
    assert last_rows.shape == (len(seqs), ours.config.vocab_size)
    start = 0
    for i, (ids, (total, cached)) in enumerate(zip(seqs, shapes)):
        expected = hf_logits(ref, ids)[cached:]
        n = total - cached
        assert_logits_close(all_rows[start : start + n], expected, f"sequence {i}")
        assert_logits_close(last_rows[i], expected[-1], f"sequence {i}")
        start += n


def assert_batch_invariant(model) -> None:
    """A sequence's logits and K/V are bit for bit the same whatever else shares its forwards:
    the engine's side of "pipelined == blocking, token for token", where which sequences share a
    decode step depends on timing. MKL broke it (linear.py: 1, 2-3 and 4+ rows summed in three
    orders; a leaf's greedy output differed between the two modes). Chunking is held fixed: a
    token's attention sums over however many keys its chunk sees, in an order that depends on
    that number, so a prompt prefilled in other pieces agrees to ~1e-7, not bit for bit."""
    ids = random_ids(40, seed=20)
    others = [random_ids(25 + i, seed=30 + i) for i in range(8)]

    def run(chunks: list[int], batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill `ids` in `chunks`, each beside `batch_size - 1` other prompts, then decode one
        step beside them; the sequence's decode-step logits and its K/V."""
        kv = make_kv_buffer(model.config, 2 * NUM_SLOTS, torch.float32)
        pool = SlotPool(2 * NUM_SLOTS, seed=batch_size)
        slots = pool.take(len(ids) + 1)
        peers = others[: batch_size - 1]
        done = 0
        for chunk in chunks:
            peer_slots = [pool.take(len(o) + 1) for o in peers]
            batch = [(slots[: done + chunk], ids[done : done + chunk])]
            batch += [(s[:-1], o) for s, o in zip(peer_slots, peers)]
            first = model(ForwardBatch.build(*map(list, zip(*batch))), kv)
            done += chunk
        step = [(slots, [int(first[0].argmax())])] + [(s, [7]) for s in peer_slots]
        logits = model(ForwardBatch.build(*map(list, zip(*step))), kv)[0]
        return logits, kv[:, :, torch.tensor(slots)]

    for chunks in ([40], [20, 20]):
        want_logits, want_kv = run(chunks, 1)
        for batch_size in (2, 3, 4, 9):
            logits, kv = run(chunks, batch_size)
            what = f"chunks {chunks}, {batch_size} in each batch"
            assert torch.equal(kv, want_kv), f"K/V differ: {what}"
            assert torch.equal(logits, want_logits), f"decode-step logits differ: {what}"


def test_a_sequence_is_computed_the_same_in_any_batch(pair):
    assert_batch_invariant(pair[0])


def test_kv_buffer_layout(pair):
    ours, _ = pair
    cfg = ours.config
    kv = make_kv_buffer(cfg, 64, torch.float32)
    assert kv.shape == (cfg.num_layers, 2, 64, cfg.num_kv_heads, cfg.head_dim)
    assert kv.is_contiguous()
    ours(ForwardBatch.build([[5, 9, 60]], [[7, 8, 9]]), kv)
    written = kv.abs().sum(dim=(0, 1, 3, 4)).nonzero().flatten().tolist()
    assert written == [5, 9, 60]


def test_build_rejects_bad_lengths():
    with pytest.raises(ValueError, match="new tokens"):
        ForwardBatch.build([[0, 1]], [[1, 2, 3]])
    with pytest.raises(ValueError, match="slot lists"):
        ForwardBatch.build([[0]], [[1], [2]])


def test_checkpoint_not_matching_config_is_rejected(tmp_path):
    source = Path(tiny_model_dir("llama"))
    for file in source.iterdir():
        shutil.copy(file, tmp_path / file.name)
    config = json.loads((source / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="lacks 9 tensors"):
        CausalLM.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        CausalLM.from_pretrained(str(tmp_path))


@pytest.fixture(scope="module")
def smollm2():
    path = resolve_model_path("smollm2-135m")  # converts the GGUF once, then reuses the cache
    ours = CausalLM.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return ours, ref, tokenizer


def chat_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_smollm2_config(smollm2):
    cfg = smollm2[0].config
    assert (cfg.model_type, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == ("llama", 30, 9, 3)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == (2,)
    assert smollm2[2].chat_template and "<|im_start|>" in smollm2[2].chat_template


def test_smollm2_logits_match_transformers(smollm2):
    ours, ref, tokenizer = smollm2
    ids = chat_ids(tokenizer, "What is the capital of France?")
    kv = make_kv_buffer(ours.config, 256, torch.float32)
    slots = SlotPool(256).take(len(ids))
    got = ours(ForwardBatch.build([slots], [ids]), kv, all_logits=True)
    assert_logits_close(got, hf_logits(ref, ids))


def test_smollm2_greedy_generation_matches_transformers(smollm2):
    ours, ref, tokenizer = smollm2
    ids = chat_ids(tokenizer, "Write a short poem about the sea.")
    with torch.inference_mode():
        expected = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
    expected = expected[0, len(ids) :].tolist()
    assert len(expected) == 16  # no early end of turn, so all 16 tokens are compared
    kv = make_kv_buffer(ours.config, 256, torch.float32)
    slots = SlotPool(256).take(len(ids) + 16)
    new, got = ids, []
    while len(got) < 16:
        logits = ours(ForwardBatch.build([slots[: len(ids) + len(got)]], [new]), kv)
        got.append(int(logits[0].argmax()))
        new = got[-1:]
    assert got == expected, tokenizer.decode(got)


def test_smollm2_is_computed_the_same_in_any_batch(smollm2):
    assert_batch_invariant(smollm2[0])
