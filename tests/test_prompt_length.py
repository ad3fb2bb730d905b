"""One estimate of an agent's prompt (planning/prompt_length.py): the planner's KV pools and cost
model and the simulator's workload count the same tokens, by the model's tokenizer where a local
directory holds one."""

from __future__ import annotations

import pytest

from planning.prompt_length import (
    CHAT_MARKUP_TOKENS,
    DEFAULT_QUESTION_TOKENS,
    estimate_tokens,
    prompt_tokens,
    static_pieces,
)
from router.config import TopologyConfig
from router.config_loader import load_config
from router.topology import decode_budget
from sglang_ext.hf_tokenizer import load_tokenizer
from simulation.workload import from_config


@pytest.mark.parametrize("name", ["tree_9_3_1_cpu", "tree_9_3_1_dummy_gpu", "tree_3_1_mixed_cpu"])
def test_the_planner_and_the_simulator_count_one_prompt(name):
    cfg = load_config(name)
    for tokens in (DEFAULT_QUESTION_TOKENS, 500):
        work = from_config(cfg, question_tokens=tokens).agents
        for a in cfg.agents:
            w = work[a.id]
            assert w.output_tokens == decode_budget(cfg, a.id)
            precursors = sum(work[p].output_tokens for p in w.precursors)
            assert prompt_tokens(cfg, a.id, tokens) == sum(w.pieces) + precursors
            assert len(w.pieces) == len(w.precursors) + 1
    # The question allowance lands where {question} is: a leaf's prompt grows by the difference.
    leaf = cfg.agents[0].id
    assert prompt_tokens(cfg, leaf, 500) - prompt_tokens(cfg, leaf, 100) == 400


def _config(model_path: str) -> TopologyConfig:
    return TopologyConfig.model_validate(
        {
            "name": "counted",
            "models": {"m": {"model_path": model_path}},
            "templates": {
                "leaf": {"system": "Digits: 0123456789 0123456789", "user": "{question}"},
                "agg": {"user": "Q: {question}\n1234567890 1234567890\n<|answer:a|>\nEnd."},
            },
            "agents": [
                {"id": "a", "model": "m", "template": "leaf", "sampling": {"max_new_tokens": 7}},
                {"id": "s", "model": "m", "template": "agg"},
            ],
        }
    )


def test_a_local_model_directory_counts_with_its_tokenizer(smollm2_dir):
    tok = load_tokenizer(smollm2_dir)
    count = lambda text: len(tok.encode(text, add_special_tokens=False))
    counted, estimated = _config(smollm2_dir), _config("smollm2-135m")
    system = "Digits: 0123456789 0123456789"
    assert static_pieces(counted, "a", 10) == (count(system) + CHAT_MARKUP_TOKENS + 10,)
    head, tail = "Q: \n1234567890 1234567890\n", "\nEnd."
    assert static_pieces(counted, "s", 10) == (count(head) + CHAT_MARKUP_TOKENS + 10, count(tail))
    # SmolLM2 spells digits one token each: the character estimate would count a quarter.
    assert count(system) > 1.5 * estimate_tokens(system)
    assert static_pieces(estimated, "a", 10) == (estimate_tokens(system) + CHAT_MARKUP_TOKENS + 10,)
    # An unset max_new_tokens is SGLang's default; the aggregator reads a's whole output.
    assert prompt_tokens(counted, "s", 10) == sum(static_pieces(counted, "s", 10)) + 7


def test_the_chat_markup_is_what_the_chat_template_adds(smollm2_dir):
    tok = load_tokenizer(smollm2_dir)
    turns = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    text = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    assert len(tok.encode(text, add_special_tokens=False)) - 2 == CHAT_MARKUP_TOKENS
