"""ForwardBatch: the tensors one model forward needs (new tokens, their positions and KV slots).

Built by the scheduler for each step (prefills and decodes mixed); read by `CausalLM.forward`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.LongTensor  # [T] new tokens of all sequences, concatenated in order
    positions: torch.LongTensor  # [T] absolute position of each new token
    out_slots: torch.LongTensor  # [T] KV slot where each new token's K/V is written
    seq_slots: list[torch.LongTensor]  # per sequence: slots of tokens 0..seq_len-1 (cached + new)
    extend_lens: list[int]  # per sequence: number of new tokens (1 in a decode step)

    @property
    def num_seqs(self) -> int:
        return len(self.extend_lens)

    @classmethod
    def build(
        cls, seq_slots: Sequence[Sequence[int] | torch.Tensor], new_ids: Sequence[Sequence[int]]
    ) -> ForwardBatch:
        """Batch sequences given each one's full slot list and its new (not yet cached) token ids.

        The new tokens are the last `len(new_ids[i])` of sequence i, so its cached length is
        `len(seq_slots[i]) - len(new_ids[i])`.
        """
        if len(seq_slots) != len(new_ids):
            raise ValueError(f"{len(seq_slots)} slot lists for {len(new_ids)} sequences")
        slots = [torch.as_tensor(s, dtype=torch.long) for s in seq_slots]
        ids, positions, out_slots, extend_lens = [], [], [], []
        for i, (seq, new) in enumerate(zip(slots, new_ids)):
            n, total = len(new), len(seq)
            if n == 0 or n > total:
                raise ValueError(f"sequence {i}: {n} new tokens but {total} slots")
            ids.extend(new)
            positions.append(torch.arange(total - n, total))
            out_slots.append(seq[total - n :])
            extend_lens.append(n)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.cat(positions),
            out_slots=torch.cat(out_slots),
            seq_slots=slots,
            extend_lens=extend_lens,
        )
