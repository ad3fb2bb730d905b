"""Prompts as runs of identified token segments, and a prefill worker's radix cache over them:
how many leading tokens of a prompt are already cached is the longest common prefix with any
prompt prefilled there before (SGLang's radix cache without eviction: pools hold a few
questions)."""

from __future__ import annotations

# A segment: (what its tokens are, how many). Two segments with the same key hold the same tokens
# for as far as both go (a precursor's output streamed further in one than in the other).
Segment = tuple[str, int]
Prompt = tuple[Segment, ...]


def length(prompt: Prompt) -> int:
    return sum(n for _, n in prompt)


def common_prefix(a: Prompt, b: Prompt) -> int:
    """Tokens the two prompts share from the start."""
    shared = 0
    for (ka, na), (kb, nb) in zip(a, b):
        if ka != kb:
            break
        shared += min(na, nb)
        if na != nb:
            break
    return shared


class RadixCache:
    """The prompts one prefill worker has computed (each a path of the radix tree), indexed by
    their first segment: prompts that begin differently share nothing."""

    def __init__(self) -> None:
        self._paths: dict[str, list[Prompt]] = {}

    def cached(self, prompt: Prompt) -> int:
        if not prompt:
            return 0
        paths = self._paths.get(prompt[0][0], ())
        return max((common_prefix(prompt, p) for p in paths), default=0)

    def insert(self, prompt: Prompt) -> None:
        if not prompt:
            return
        n = length(prompt)
        paths = self._paths.setdefault(prompt[0][0], [])
        # A path that is a prefix of the new one adds nothing: drop it (keeps lookups short).
        paths[:] = [p for p in paths if common_prefix(p, prompt) < length(p)]
        if all(common_prefix(prompt, p) < n for p in paths):
            paths.append(prompt)

    def flush(self) -> None:
        self._paths.clear()
