"""Reads an HF model directory (config.json + *.safetensors) into a `CausalLM`, or fills it
with seeded random weights (`--load-format dummy`).

Called by `CausalLM.from_pretrained`. HF tensor names map one-to-one onto our module names,
except q/k/v and gate/up, which we stack into one `MergedLinear` each (fewer matmuls per layer).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from sglang_ext.engine.linear import MergedLinear

# HF projection name -> (our merged module name, shard index inside it).
PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def read_hf_config(path: str | Path) -> dict:
    """config.json of an HF dir, with generation_config.json's eos ids merged into `eos_token_id`."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} is missing: give an HF model directory")
    config = json.loads(config_file.read_text())
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
        config["eos_token_id"] = _as_list(config.get("eos_token_id")) + _as_list(eos)
    return config


def _as_list(ids: int | list[int] | None) -> list[int]:
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


def load_weights(model: nn.Module, path: str | Path, tied_lm_head: bool) -> None:
    """Copy every tensor of the safetensors files under `path` into `model`'s parameters."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}: convert the model to safetensors")
    params = dict(model.named_parameters())
    expected = set()  # (our parameter name, shard index or None) still to be loaded
    for name, module in model.named_modules():
        shards = range(len(module.shard_sizes)) if isinstance(module, MergedLinear) else [None]
        for leaf, _ in module.named_parameters(recurse=False):
            expected |= {(f"{name}.{leaf}", shard) for shard in shards}
    if tied_lm_head:
        expected.discard(("lm_head.weight", None))  # the same Parameter as embed_tokens.weight

    loaded = 0
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for hf_name in reader.keys():  # noqa: SIM118 (safe_open is not a dict)
                # Older checkpoints also store RoPE's inv_freq buffer; we recompute it.
                if hf_name.endswith("rotary_emb.inv_freq") or (
                    tied_lm_head and hf_name == "lm_head.weight"
                ):
                    continue
                name, shard = _our_name(hf_name)
                if name not in params:
                    raise ValueError(f"{file.name}: unexpected tensor '{hf_name}' for this model")
                dest = params[name].data
                if shard is not None:
                    module = model.get_submodule(name.rsplit(".", 1)[0])
                    offset = sum(module.shard_sizes[:shard])
                    dest = dest.narrow(0, offset, module.shard_sizes[shard])
                tensor = reader.get_tensor(hf_name)
                if tensor.shape != dest.shape:
                    raise ValueError(
                        f"'{hf_name}' has shape {tuple(tensor.shape)}, "
                        f"expected {tuple(dest.shape)}: config.json does not match"
                    )
                with torch.no_grad():
                    dest.copy_(tensor)
                expected.discard((name, shard))
                loaded += 1
    if expected and not loaded:
        raise ValueError(
            f"{path} holds no weights (a shape-only model?): serve it with --load-format dummy, "
            'or set "load_format": "dummy" on the model in the config'
        )
    if expected:
        names = sorted(f"{n}[{s}]" if s is not None else n for n, s in expected)
        raise ValueError(f"{path} lacks {len(names)} tensors, e.g. {names[:3]}")


# Dummy weights depend on this seed and the parameter's name only (SGLang's dummy loader also
# uses one fixed seed), so every worker of a model -- a PD pair's prefill and decode included --
# holds the same weights, whatever its --random-seed.
DUMMY_SEED = 1234


def init_dummy_weights(model: nn.Module, std: float, seed: int = DUMMY_SEED) -> None:
    """Random weights in place, no file read: norms 1, biases 0, every other tensor
    N(0, std) (HF's initializer_range), drawn in float32 from a generator seeded by the name."""
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied weight is listed once
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
                param.copy_(torch.empty(param.shape).normal_(0.0, std, generator=gen))


def _our_name(hf_name: str) -> tuple[str, int | None]:
    prefix, proj, leaf = hf_name.rsplit(".", 2) if hf_name.count(".") >= 2 else ("", "", "")
    if proj in PACKED:
        merged, shard = PACKED[proj]
        return f"{prefix}.{merged}.{leaf}", shard
    return hf_name, None
