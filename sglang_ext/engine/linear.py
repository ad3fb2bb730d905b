"""Linear: nn.Linear whose fp32 weight is prepacked once for oneDNN (the CPU matmul library).

`CausalLM.from_pretrained` packs every projection and the lm_head. Two reasons, both measured on
this project's AMD EPYC (AVX2) with one thread:
- **Batch invariance.** MKL (torch's default fp32 CPU matmul) sums a row in one order for 1 row,
  another for 2-3 rows and a third for 4 or more, so a sequence's logits depended on how many
  others shared its decode step, and greedy outputs on timing (in a 20-question run at
  concurrency 1 one leaf's output differed between pipelined and blocking at its 21st token).
  oneDNN's packed kernel gives a row the same result at any row count from 2 up (checked to 600
  rows for SmolLM2's shapes; tests/test_model_forward.py holds it for batches of 1-9), and fewer
  rows are padded (MIN_ROWS): a token's K/V and logits are the same whatever shares its forward.
- **Speed.** MKL re-packs the weight on every call. A SmolLM2 decode step of 1 / 2 / 3 / 4 / 9 /
  16 rows takes 0.94 / 0.63 / 0.59 / 0.72 / 0.70 / 0.79 of MKL's time packed
  (benchmarks/bench_projections.py, both interleaved in one run; docs/benchmarks.md).
The price: logits differ from transformers' (which uses MKL) by up to 1e-5 of the largest logit
(1.1e-4 on SmolLM2's), the same fp32 products summed in another order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN picks the packed layout for this many input rows; any row count works afterwards.
PACK_ROWS_HINT = 16
# Fewer rows are padded to this many (copies of the last, dropped afterwards). One row alone is
# summed in another order (batch invariance, above), and oneDNN ran 2 rows slower than 4 here (a
# SmolLM2 decode step took 75 / 60 / 56 ms at 2 / 3 / 4 rows unpadded: an ad-hoc measurement).
MIN_ROWS = 4


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
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.shape[0]
        if rows < MIN_ROWS:  # see MIN_ROWS
            return self._packed(torch.cat([x, x[-1:].expand(MIN_ROWS - rows, -1)]))[:rows]
        return self._packed(x)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


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
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)
