"""A plan's request split, as the shell router applies it and the simulator models it: smooth
weighted round robin, each request to the replica furthest below its share of what was sent.
Deterministic and never bursty, unlike random draws by share, which pile requests onto one
replica now and then and so run slower than the plan was predicted to."""

from __future__ import annotations


def next_by_share(sent: list[int], shares: list[float]) -> int:
    """The replica for the next request (and counts it in `sent`)."""
    i = min(range(len(shares)), key=lambda k: (sent[k] + 1) / shares[k])
    sent[i] += 1
    return i
