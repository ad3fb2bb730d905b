"""Weight-free models: `moa-pd dummy-model`, 'dummy:SHAPE' in the model store, `--load-format
dummy` in the reference engine and on the launcher's command lines, and the shapes' sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer

from launch.cli import main as cli_main
from launch.worker_cmd import worker_argv
from planning.model_memory import count_parameters
from planning.models import resolve_model
from planning.pack import PlanError
from router.config import ModelSpec
from sglang_ext.engine import model_store
from sglang_ext.engine.dummy_model import PLACEHOLDER_NAME, QWEN3_VOCAB, hf_config
from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.model import CausalLM, ModelConfig, make_kv_buffer
from sglang_ext.engine.model_store import resolve_model_path
from sglang_ext.engine.weights import init_dummy_weights, read_hf_config
from sglang_ext.server_args import parse_args

# Parameters of the published checkpoints (vocabulary 151,936), from each hub model card.
PUBLISHED_PARAMS = {
    "qwen3-1.7b": 1.72e9,
    "qwen3-4b": 4.02e9,
    "qwen3-8b": 8.19e9,
    "qwen3-14b": 14.77e9,
    "qwen3-32b": 32.76e9,
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dummy") / "tiny"
    assert cli_main(["dummy-model", "--shape", "qwen3-tiny", "--out", str(out)]) == 0
    return out


def test_dummy_model_dir_loads_in_transformers_with_a_valid_empty_safetensors(tiny_dir):
    config = AutoConfig.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert config.model_type == "qwen3" and config.architectures == ["Qwen3ForCausalLM"]
    assert config.vocab_size == len(tokenizer) == 49152  # tiny keeps the tokenizer's vocabulary
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (64, 2, 32)
    assert (
        config.eos_token_id
        == tokenizer.eos_token_id
        == tokenizer.convert_tokens_to_ids("<|im_end|>")
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    weights = tiny_dir / PLACEHOLDER_NAME
    assert weights.stat().st_size == 10
    with safe_open(str(weights), framework="pt") as f:
        assert list(f.keys()) == []


@pytest.mark.parametrize("shape", sorted(PUBLISHED_PARAMS))
def test_written_real_shapes_have_the_published_parameter_counts(shape, tmp_path):
    # What `moa-pd dummy-model` writes, counted as the planner counts it (meta device).
    out = tmp_path / shape
    assert cli_main(["dummy-model", "--shape", shape, "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["vocab_size"] == QWEN3_VOCAB
    params = count_parameters(str(out))
    assert abs(params - PUBLISHED_PARAMS[shape]) / PUBLISHED_PARAMS[shape] < 0.005, params


def test_a_shape_smaller_than_its_tokenizer_is_refused():
    class Tok:
        bos_token_id = eos_token_id = pad_token_id = 0

        def __len__(self):
            return QWEN3_VOCAB + 1

    with pytest.raises(ValueError, match="151936 vocabulary rows, fewer than the tokenizer's"):
        hf_config("qwen3-8b", Tok())


def test_qwen3_8b_shape_is_the_issues_shape(tmp_path):
    out = tmp_path / "q8"
    assert cli_main(["dummy-model", "--shape", "qwen3-8b", "--out", str(out)]) == 0
    c = AutoConfig.from_pretrained(out)
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (4096, 36, 32)
    assert (c.num_key_value_heads, c.head_dim, c.intermediate_size) == (8, 128, 12288)


def test_dummy_model_refuses_a_non_empty_out_and_an_unknown_shape(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    assert cli_main(["dummy-model", "--shape", "qwen3-tiny", "--out", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "x"
    with pytest.raises(SystemExit) as e:
        cli_main(["dummy-model", "--shape", "qwen3-9b", "--out", str(tmp_path / "n")])
    assert e.value.code == 2
    assert "invalid choice: 'qwen3-9b'" in capsys.readouterr().err


def test_model_store_writes_a_dummy_shape_once(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    # The tokenizer comes from the store's SmolLM2 conversion: share the real one.
    smollm2 = Path(resolve_model_path("smollm2-135m"))
    (models / model_store.SMOLLM2_DIRNAME).symlink_to(smollm2)
    path = Path(resolve_model_path("dummy:qwen3-tiny", str(tmp_path)))
    assert path == models / "dummy-qwen3-tiny"
    assert (path / model_store.DONE_MARKER).is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert resolve_model_path("dummy:Qwen3-Tiny", str(tmp_path)) == str(path)
    assert (path / "config.json").stat().st_mtime_ns == stamp  # not rewritten
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))  # an old write
    assert resolve_model_path("dummy:qwen3-tiny", str(tmp_path)) == str(path)
    assert json.loads((path / "config.json").read_text()) == config  # written again
    with pytest.raises(ValueError, match="unknown model shape 'qwen3-9b': use one of qwen3-tiny"):
        resolve_model_path("dummy:qwen3-9b", str(tmp_path))
    assert not (models / "dummy-qwen3-9b").exists()


def test_reference_engine_dummy_weights_are_seeded_and_need_no_weights(tiny_dir):
    a = CausalLM.from_pretrained(str(tiny_dir), load_format="dummy")
    b = CausalLM.from_pretrained(str(tiny_dir), load_format="dummy")
    # Loading packs the projections (linear.py): what stays dense must agree, and the logits.
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = [5, 17, 300, 9, 42]
    logits = [
        m(
            ForwardBatch.build([list(range(len(ids)))], [ids]),
            make_kv_buffer(m.config, 8, torch.float32),
        )
        for m in (a, b)
    ]
    assert torch.equal(*logits)
    # The weights as drawn, before packing.
    raw = CausalLM(ModelConfig.from_hf(read_hf_config(str(tiny_dir))))
    init_dummy_weights(raw, std=0.02)
    sa = raw.state_dict()
    qkv = sa["model.layers.0.self_attn.qkv_proj.weight"]
    assert 0.015 < qkv.std().item() < 0.025  # N(0, initializer_range)
    assert not torch.equal(qkv, sa["model.layers.1.self_attn.qkv_proj.weight"])
    assert torch.equal(sa["model.norm.weight"], torch.ones(64))
    with pytest.raises(ValueError, match="holds no weights .* --load-format dummy"):
        CausalLM.from_pretrained(str(tiny_dir))


def test_server_args_take_sglangs_load_format():
    assert parse_args(["--model-path", "m", "--load-format", "dummy"]).load_format == "dummy"
    assert parse_args(["--model-path", "m"]).load_format == "auto"
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "m", "--load-format", "npcache"])


@pytest.mark.parametrize("backend", ["torch", "sglang"])
def test_launcher_resolves_dummy_models_and_passes_load_format(backend):
    spec = ModelSpec(model_path="dummy:qwen3-tiny")
    assert spec.load_format == "dummy"
    path, tokenizer = resolve_model(spec, backend)
    assert path == tokenizer == resolve_model_path("dummy:qwen3-tiny")
    assert json.loads((Path(path) / "config.json").read_text())["hidden_size"] == 64
    argv = worker_argv(backend, path, spec, "prefill", "127.0.0.1", 30000, 8998)
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert argv[argv.index("--model-path") + 1] == path
    plain = worker_argv(backend, path, ModelSpec(model_path=path), "decode", "127.0.0.1", 1, None)
    assert "--load-format" not in plain
    with pytest.raises(PlanError, match="unknown model shape 'nope'"):
        resolve_model(ModelSpec(model_path="dummy:nope"), backend)
