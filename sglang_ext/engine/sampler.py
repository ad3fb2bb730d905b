"""Sampler: next-token choice from the model's last-position logits, plus logprobs.

Called by the scheduler once per step for the sequences that produce a token. Greedy rows are one
argmax; other rows apply penalties, temperature, top-k, top-p and min-p, then draw with a
torch.Generator seeded from (`sampling_seed`, output position), so a seeded request repeats
exactly whatever it is batched with and whichever worker draws each token (PD: prefill draws the
first, decode the rest). Logprobs are of the raw model distribution (before temperature and filters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ext.engine.request import Req, SamplingParams


@dataclass(slots=True)
class SampleOutput:
    ids: list[int]
    logprobs: list[float]  # empty unless some request asked for logprobs
    top_logprobs: list[list[tuple[float, int]]]


def _apply_penalties(row: torch.Tensor, sp: SamplingParams, output_ids: list[int]) -> torch.Tensor:
    if not output_ids:
        return row
    ids, counts = torch.tensor(output_ids, dtype=torch.int64).unique(return_counts=True)
    vals = row[ids]
    if sp.repetition_penalty != 1.0:
        vals = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    vals = vals - sp.frequency_penalty * counts - sp.presence_penalty
    row = row.clone()
    row[ids] = vals
    return row


def _draw(row: torch.Tensor, sp: SamplingParams, gen: torch.Generator | None) -> int:
    row = row / sp.temperature
    if 0 < sp.top_k < row.numel():
        kth = torch.topk(row, sp.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # Keep the smallest head whose mass reaches top_p (the first token is always kept).
        drop = (sorted_p.cumsum(0) - sorted_p) > sp.top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    if sp.min_p > 0.0:
        probs = probs.masked_fill(probs < sp.min_p * probs.max(), 0.0)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen).item())


# An odd 64-bit constant: spreads seeds far apart before adding the position.
_GOLDEN = 0x9E3779B97F4A7C15


def _generator(req: Req, default_gen: torch.Generator) -> torch.Generator:
    seed = req.sampling.sampling_seed
    if seed is None:
        return default_gen
    return torch.Generator().manual_seed((seed * _GOLDEN + len(req.output_ids)) % 2**64)


def sample(logits: torch.Tensor, reqs: list[Req], default_gen: torch.Generator) -> SampleOutput:
    """One token per row of `logits` [len(reqs), vocab]."""
    logits = logits.float()
    ids = logits.argmax(dim=-1).tolist()
    for i, req in enumerate(reqs):
        sp = req.sampling
        if not sp.greedy or sp.penalized:
            row = _apply_penalties(logits[i], sp, req.output_ids) if sp.penalized else logits[i]
            ids[i] = (
                int(row.argmax()) if sp.greedy else _draw(row, sp, _generator(req, default_gen))
            )
    out = SampleOutput(ids, [], [])
    if any(r.return_logprob for r in reqs):
        logp = torch.log_softmax(logits, dim=-1)
        out.logprobs = logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()
        k = max(r.top_logprobs_num for r in reqs)
        if k > 0:
            top = torch.topk(logp, k, dim=-1)
            vals, idx = top.values.tolist(), top.indices.tolist()
            out.top_logprobs = [
                list(zip(vals[i][: r.top_logprobs_num], idx[i][: r.top_logprobs_num]))
                for i, r in enumerate(reqs)
            ]
        else:
            out.top_logprobs = [[] for _ in reqs]
    return out
