"""HumanEval and HumanEval+ grading: take the code out of a reply and run its tests in the sandbox.

Called by experiments.scoring for datasets `humaneval` and `humaneval_plus`. HumanEval runs the
problem's own `check(candidate)`. HumanEval+ compares the candidate with the canonical solution
on every base and plus input, in the way EvalPlus does: exact match, and for float results a
tolerance of atol (1e-6 when the task gives 0) with rtol 1e-7; find_zero is checked by
|poly(xs, x)| <= atol. The test harness prints a per-run nonce after the last test, so a program
that exits early with status 0 does not pass. The sandbox stops accidents and runaway code. It
does not guard the verdict against a program written to fake a pass, and neither does EvalPlus.
"""

from __future__ import annotations

import json
import re
import secrets

from experiments.datasets import Question
from experiments.scoring.code_sandbox import Limits, run_python
from experiments.scoring.score import Score

HUMANEVAL_LIMITS = Limits(wall_s=10.0, cpu_s=10)
# Up to ~1,000 extra inputs per problem, each run through both solutions: more time.
HUMANEVAL_PLUS_LIMITS = Limits(wall_s=30.0, cpu_s=30)

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)

# The trusted harness, run as the sandbox's main.py; the candidate runs in the same sandboxed
# process, after it has read its input and (HumanEval+) computed the reference outputs. The
# candidate module is not named __main__, so a reply's `if __name__ == "__main__":` demo code
# (often reading input()) does not run.
_HARNESS = """\
import copy, json, sys
_nonce = sys.stdin.readline().strip()
_data = json.loads(sys.stdin.read())
_entry, _atol = _data["entry_point"], _data["atol"]
if _data["inputs"] is not None:
    _ref = {"__name__": "reference"}
    exec(compile(_data["reference"], "reference.py", "exec"), _ref)
    _expected = [_ref[_entry](*copy.deepcopy(args)) for args in _data["inputs"]]
_cand = {"__name__": "candidate"}
exec(compile(_data["program"], "candidate.py", "exec"), _cand)
_fn = _cand[_entry]


def _floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(i, float) for i in x)


def _same(out, exp, args):
    if _entry == "find_zero":
        return abs(_ref["poly"](*args, out)) <= _atol
    if out == exp:
        return True
    atol = 1e-6 if _atol == 0 and _floats(exp) else _atol
    if atol == 0 or type(out) is not type(exp):
        return False
    a, b = (list(out), list(exp)) if isinstance(exp, (list, tuple)) else ([out], [exp])
    if len(a) != len(b):
        return False
    return all(abs(x - y) <= atol + 1e-7 * abs(y) for x, y in zip(a, b))


if _data["inputs"] is None:  # HumanEval: the problem's own check(candidate)
    # In the candidate's namespace, as the official harness does: some checks call the
    # prompt's helpers (poly, encode_cyclic) or the function by name.
    exec(compile(_data["test"], "tests.py", "exec"), _cand)
    _cand["check"](_fn)
else:  # HumanEval+: the candidate against the reference on every input
    for _i, (_args, _exp) in enumerate(zip(_data["inputs"], _expected)):
        _out = _fn(*copy.deepcopy(_args))
        if not _same(_out, _exp, _args):
            print(f"input {_i}: expected {_exp!r:.200}, got {_out!r:.200}", file=sys.stderr)
            sys.exit(1)
print(_nonce)
"""


def extract_code(text: str) -> str:
    """The code in a reply: the last fenced block that defines a function, else the last
    fenced block, else the whole reply (a bare completion)."""
    blocks = [m.group(1) for m in _FENCE.finditer(text)]
    with_def = [b for b in blocks if re.search(r"^\s*def\s", b, re.MULTILINE)]
    if with_def:
        return with_def[-1]
    return blocks[-1] if blocks else text


def build_program(q: Question, code: str) -> str:
    """Prompt plus code. A full function redefines the prompt's stub (whose body is only its
    docstring), so helpers and imports from the prompt stay; otherwise the code is read as the
    body that completes the prompt."""
    entry = q.extra["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        return f"{q.question}\n    pass\n\n{code}\n"
    return q.question + code


def score(q: Question, output_text: str, limits: Limits | None = None) -> Score:
    """Run the tests; `correct` is True only when every test passed inside the time limits."""
    code = extract_code(output_text)
    program = build_program(q, code)
    nonce = secrets.token_hex(16)
    plus = "plus_input" in q.extra
    payload = {
        "entry_point": q.extra["entry_point"],
        "atol": float(q.extra.get("atol") or 0),
        "program": program,
        "test": q.extra.get("test", ""),
        "reference": q.question + q.extra["canonical_solution"],
        "inputs": list(q.extra.get("base_input") or []) + list(q.extra["plus_input"])
        if plus
        else None,
    }
    limits = limits or (HUMANEVAL_PLUS_LIMITS if plus else HUMANEVAL_LIMITS)
    run = run_python(_HARNESS, stdin=nonce + "\n" + json.dumps(payload), limits=limits)
    passed = run.returncode == 0 and run.stdout.strip().endswith(nonce)
    details = {
        "returncode": run.returncode,
        "timed_out": run.timed_out,
        "wall_s": round(run.wall_s, 3),
        "stderr_tail": run.stderr[-500:],
        "isolation_missing": run.missing_isolation,
    }
    return Score(correct=passed, extracted=code, details=details)
