"""How each benchmark's question is put to a proposer: one user-turn string per `Question`.

Called by the experiment runner. The wording is ours; each format matches what
`experiments.scoring` extracts (a boxed answer, "The answer is N", a letter, a code block...).
"""

from __future__ import annotations

from experiments.datasets import Question

LETTERS = "ABCDEFGHIJ"

_MATH = (
    "{question}\n\n"
    "Solve the problem step by step. Write the final answer, simplified, inside \\boxed{{}} "
    "at the end of your response."
)
_AIME = (
    "{question}\n\n"
    "Solve the problem step by step. The answer is an integer from 0 to 999; write it inside "
    "\\boxed{{}} at the end of your response."
)
_GSM8K = (
    "{question}\n\n"
    "Work through the problem step by step, then end your response with the line "
    "'The answer is N.', where N is the final number only (no units)."
)
_MCQ = (
    "{question}\n\n{options}\n\n"
    "Think step by step, then answer with the letter of the correct option. "
    "End your response with 'The answer is (X).' where X is that letter."
)
_BBH = (
    "{question}\n\n"
    "Think step by step, then end your response with 'So the answer is X.' where X is {fmt}."
)
_CODE = (
    "Complete the following Python function.\n\n```python\n{question}```\n\n"
    "Reply with the complete function (its signature and body, and any imports or helpers it "
    "needs) in one ```python code block."
)
_GENERIC = "{question}\n\nEnd your response with 'The answer is X.' where X is your final answer."

# What the final answer of each BBH task looks like, so the extractor sees the gold's form.
_BBH_FORMATS = {
    "boolean_expressions": "True or False",
    "causal_judgement": "Yes or No",
    "formal_fallacies": "valid or invalid",
    "navigate": "Yes or No",
    "sports_understanding": "yes or no",
    "web_of_lies": "Yes or No",
    "dyck_languages": "the closing brackets that complete the sequence, separated by spaces",
    "multistep_arithmetic_two": "the resulting integer",
    "object_counting": "the number, in digits",
    "word_sorting": "the words sorted alphabetically, separated by single spaces",
}
_BBH_OPTION_FORMAT = "the letter of the correct option in parentheses, e.g. (A)"


def format_options(choices: list[str]) -> str:
    """Letter the options A-J, one per line: 'A. first option'."""
    if len(choices) > len(LETTERS):
        raise ValueError(f"{len(choices)} options; at most {len(LETTERS)} can be lettered A-J")
    return "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(choices))


def build_question_prompt(q: Question) -> str:
    """The proposer-facing prompt for one question; IFBench prompts go out unchanged."""
    name = q.dataset
    if name == "ifbench":
        return q.question  # the constraints are part of the prompt; any wrapper would alter them
    if name in ("math500", "hmmt_feb_2025"):
        return _MATH.format(question=q.question)
    if name == "aime2025":
        return _AIME.format(question=q.question)
    if name == "gsm8k":
        return _GSM8K.format(question=q.question)
    if name in ("humaneval", "humaneval_plus"):
        return _CODE.format(question=q.question)
    if name in ("mmlu_prox_lite", "mmlu", "gpqa_diamond") or "choices" in q.extra:
        choices = q.extra.get("choices")
        if not choices:
            raise ValueError(f"question {q.id}: multiple-choice row has no 'choices' list")
        return _MCQ.format(question=q.question, options=format_options(list(choices)))
    if name == "bbh":
        task = q.extra.get("task", "")
        return _BBH.format(question=q.question, fmt=_BBH_FORMATS.get(task, _BBH_OPTION_FORMAT))
    return _GENERIC.format(question=q.question)
