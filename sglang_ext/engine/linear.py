"""Linear: nn.Linear whose fp32 weight can be prepacked once for oneDNN (the CPU matmul library).

Used for the projections of `CausalLM`; `CausalLM.from_pretrained` packs the lm_head. Why: torch's
default fp32 CPU matmul (MKL) re-packs the weight on every call, so a decode step of 9 rows
against SmolLM2's 113 MB lm_head took 36 ms vs 7 ms packed (17 vs 9 ms for one row), measured on
this project's AMD EPYC with one thread. The layers' small weights are left to MKL: packing them
too would save ~15 ms more per 9-row step but moves the logits ~1e-4 away from transformers'
(which uses MKL), past the tolerance the engine is tested to; the lm_head alone moves them 4e-5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN picks the packed layout for this many input rows; any row count works afterwards.
PACK_ROWS_HINT = 16


def onednn_available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


class Linear(nn.Linear):
    packed: torch.Tensor | None = None  # oneDNN-packed weight; forward uses it when set

    def pack(self, keep_dense: bool) -> bool:
        """Prepack an fp32 weight (False, nothing done, when oneDNN or fp32 is missing); the dense
        copy is dropped unless something else shares it (tied embeddings)."""
        if self.weight.dtype != torch.float32 or not onednn_available():
            return False
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS_HINT)
        if not keep_dense:
            self.weight = None  # the packed copy replaces it: no extra memory
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """A Linear whose output rows stack several HF projections (`shard_sizes` rows each)."""

    def __init__(self, in_features: int, shard_sizes: list[int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = shard_sizes


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up in one matmul: Llama/Qwen3 use SiLU, Gemma3
    GELU-tanh."""

    def __init__(self, hidden_size: int, intermediate_size: int, act=F.silu) -> None:
        super().__init__()
        self.act = act
        self.gate_up_proj = MergedLinear(hidden_size, [intermediate_size] * 2, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)
