"""Which replica of a model's role takes a request: one rule, for the shell router (router/pd.py)
and the simulator (simulation/workers.py, question.py) alike.

The rule: the replica with the least outstanding work per unit of its plan's share, the new
request's own work included (a replica with twice the share takes twice the load); among equals,
the one furthest below its share of what was sent so far; among those, a seeded draw. A choice
is made when the request goes out, with the load of that moment, never per agent or per question
in a fixed agent order (which pins an agent to a replica in every question). A successor's
prefill replica is chosen once, when its warm-ups start (when its whole prompt goes out if it
has none), and its warm-ups and final request all go there (the cache they build is there).

The work measure is open requests, per role, not tokens: both sides know it exactly at the
moment of a choice, the same way. A request is open on its prefill replica from its choice until
its prefill reply (a successor's from its choice, since its warm-ups and final request are bound
there, until its final request's prefill reply), on its decode replica until its stream ends.
Tokens are not known then: a successor's prompt is still growing when its prefill replica is
chosen, how much of a prompt is cached only the reply says, and a decode's length is known only
at its end (max_new_tokens is a cap); and a decode step's time is set mostly by its batch, the
number of requests decoding.

Why (outstanding + 1) ÷ share and not outstanding ÷ share: the latter gives an idle replica the
next request whatever its share, so at low load the replicas split evenly and a small share (a
replica on a device the plan knows to be busy with other workers) takes as much as a large one.
With the request's own work counted, a replica of share 0.1 takes a request only once one of
share 0.6 beside it has six open; with nothing open the largest share takes it, and replicas of
equal share alternate (by what was sent). The draw among exact equals keeps identical questions
from repeating one pattern over equal replicas (always the first would pin agents again); it is
seeded, so a run is reproducible."""

from __future__ import annotations

import random
from collections.abc import Sequence

# Ratios are compared rounded: 2 / 0.6 and 1 / 0.3 must tie.
_DIGITS = 9


def least_loaded(
    outstanding: Sequence[float],
    shares: Sequence[float],
    sent: Sequence[int],
    rng: random.Random | None = None,
) -> int:
    """The replica for the next request: least (`outstanding` + 1) ÷ share, then least
    (`sent` + 1) ÷ share, then a draw by `rng` (the lowest index without one)."""
    keys = [
        (round((o + 1) / s, _DIGITS), round((n + 1) / s, _DIGITS))
        for o, s, n in zip(outstanding, shares, sent, strict=True)
    ]
    best = min(keys)
    tied = [i for i, k in enumerate(keys) if k == best]
    return tied[0] if rng is None or len(tied) == 1 else rng.choice(tied)


class Claim:
    """One request's open work on the replica `index`; `release` it once that work is over
    (idempotent: whichever of several ends comes first releases it)."""

    __slots__ = ("_load", "index")

    def __init__(self, load: ReplicaLoad, index: int) -> None:
        self.index, self._load = index, load

    def release(self) -> None:
        if self._load is not None:
            self._load.outstanding[self.index] -= 1
            self._load = None


class ReplicaLoad:
    """The open requests and requests sent so far of one role of one model, per replica; chooses
    the replica of each request by `least_loaded`. Without shares the replicas share equally."""

    def __init__(self, n: int, shares: Sequence[float] = (), rng: random.Random | None = None):
        if shares and len(shares) != n:
            raise ValueError(f"{len(shares)} shares for {n} replicas")
        self.shares = list(shares) if shares else [1.0] * n
        self.outstanding = [0] * n
        self.sent = [0] * n
        self._rng = rng

    def choose(self) -> Claim:
        """The replica of the next request, counted as sent and open there until released."""
        i = least_loaded(self.outstanding, self.shares, self.sent, self._rng)
        self.sent[i] += 1
        self.outstanding[i] += 1
        return Claim(self, i)
