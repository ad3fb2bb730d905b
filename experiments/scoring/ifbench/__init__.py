"""IFBench scoring: run each prompt's instruction checkers on a response (official "strict" mode).

Called by `experiments.scoring.score` for dataset "ifbench"; `aggregate` gives prompt- and
instruction-level accuracy over the covered instructions, with the coverage next to it.

The checkers are our own code following the official ones (allenai/IFBench). They differ on
purpose where the official code contradicts its instruction: `count:conjunctions` counts
distinct conjunctions (not distinct raw tokens like "and" vs "And,"), `format:sub-bullets`
needs at least one '*' bullet, `format:quote_unquote` treats curly quotes as quotes,
`format:no_bullets_bullets` ignores blank lines, `format:title_case` fails any word starting
lower-case, and `repeat:repeat_span` accepts the word span the prompt asks for as well as the
character span the official code checks. NLTK tokenizers are replaced by `text.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from experiments.scoring.ifbench.registry import checker_for
from experiments.scoring.score import Score


def score_response(instruction_ids: list[str], kwargs: list[dict], response: str) -> Score:
    """Check every instruction; uncovered ones are `None` and left out of `correct`."""
    if len(kwargs) != len(instruction_ids):
        raise ValueError(
            f"IFBench row has {len(instruction_ids)} instruction ids but {len(kwargs)} kwargs "
            "dicts; they must pair up one to one"
        )
    followed: list[bool | None] = []
    for inst_id, kw in zip(instruction_ids, kwargs):
        check = checker_for(inst_id)
        if check is None:
            followed.append(None)
        else:
            # Strict mode: an empty response follows nothing, whatever the checker would say.
            followed.append(bool(response.strip()) and bool(check(response, **kw)))
    covered = [f for f in followed if f is not None]
    details = {
        "instruction_ids": list(instruction_ids),
        "followed": followed,
        "covered": len(covered),
        "total": len(followed),
    }
    return Score(correct=all(covered) if covered else None, extracted=None, details=details)


def aggregate(details: Iterable[dict[str, Any]]) -> dict[str, float | int | None]:
    """Prompt-level and instruction-level strict accuracy over covered instructions.

    A prompt counts at prompt level when at least one of its instructions is covered; it
    passes when all its covered instructions pass. Coverage numbers are reported beside.
    """
    prompts = prompt_pass = fully_covered = judged_prompts = 0
    instructions = inst_covered = inst_pass = 0
    for d in details:
        prompts += 1
        covered = [f for f in d["followed"] if f is not None]
        instructions += len(d["followed"])
        inst_covered += len(covered)
        inst_pass += sum(covered)
        fully_covered += len(covered) == len(d["followed"])
        if covered:
            judged_prompts += 1
            prompt_pass += all(covered)
    return {
        "prompt_level_strict": prompt_pass / judged_prompts if judged_prompts else None,
        "instruction_level_strict": inst_pass / inst_covered if inst_covered else None,
        "prompts": prompts,
        "prompts_judged": judged_prompts,
        "prompts_fully_covered": fully_covered,
        "instructions": instructions,
        "instructions_covered": inst_covered,
    }
