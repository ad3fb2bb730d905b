"""The code sandbox stops what model-written code must not do, and HumanEval grades through it:
an endless loop, a fork bomb, a write outside the scratch directory, a socket connection and a
memory hog all end as failures, while a correct solution passes."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import time

import psutil
import pytest

from experiments.datasets import load_questions
from experiments.scoring import code_sandbox, score
from experiments.scoring.code_sandbox import Limits, isolation_probe, run_python
from experiments.scoring.humaneval import build_program, extract_code
from experiments.scoring.humaneval import score as humaneval_score

FAST = Limits(wall_s=3.0, cpu_s=1, max_procs=8)


@pytest.fixture(scope="module")
def humaneval():
    return {q.id: q for q in load_questions("humaneval", num_samples=39)}


@pytest.fixture(scope="module")
def isolated() -> None:
    missing = isolation_probe().missing_isolation
    if missing:  # the run itself warns loudly; the isolation tests cannot hold here
        pytest.skip(f"this machine's kernel refuses {missing} (see the WARNING in the log)")


def test_correct_solution_passes_and_wrong_one_fails(humaneval) -> None:
    q = humaneval["HumanEval/0"]
    good = f"Here it is:\n```python\n{q.question}{q.extra['canonical_solution']}```\nDone."
    s = score(q, good)
    assert s.correct is True, s.details
    assert "def has_close_elements" in s.extracted
    bad = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    s = score(q, bad)
    assert s.correct is False and s.details["returncode"] != 0


def test_checks_that_call_prompt_helpers_pass(humaneval) -> None:
    # HumanEval/32's check calls the prompt's poly(); /38's calls encode_cyclic().
    for task in ("HumanEval/32", "HumanEval/38"):
        q = humaneval[task]
        assert score(q, q.question + q.extra["canonical_solution"]).correct is True, task


def test_bare_body_completion_is_accepted(humaneval) -> None:
    q = humaneval["HumanEval/2"]  # truncate_number: the prompt plus the body completes it
    assert score(q, q.extra["canonical_solution"]).correct is True


def test_endless_loop_is_stopped_by_the_cpu_limit() -> None:
    # A wall clock far beyond the 1 s of CPU: the kernel's CPU limit must be what stops it.
    r = run_python("while True:\n    pass\n", limits=dataclasses.replace(FAST, cpu_s=1, wall_s=30))
    assert not r.timed_out
    assert r.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)


def test_sleeping_program_is_stopped_by_the_wall_clock() -> None:
    r = run_python("import time\ntime.sleep(60)\n", limits=dataclasses.replace(FAST, wall_s=1.0))
    assert r.timed_out and r.returncode is None and r.wall_s < 5


def test_fork_bomb_is_contained_and_leaves_nothing_behind(isolated) -> None:
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    r = run_python(bomb, limits=dataclasses.replace(FAST, wall_s=1.5))
    assert r.timed_out or r.returncode != 0
    # The pid namespace died with its pid 1: no process of the bomb survives. The kernel kills
    # hundreds of forks one by one, so under load some are still dying when run_python returns
    # (and a sandbox of another xdist worker's test may be ending): allow them a few seconds.
    deadline = time.monotonic() + 10
    while (left := _sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []


def _sandbox_processes() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["status"] != psutil.STATUS_ZOMBIE
        and any("moa-pd-sandbox-" in part for part in p.info["cmdline"] or [])
    ]


def test_write_outside_the_scratch_directory_is_refused(tmp_path, isolated) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)  # even a world-writable directory: the mount is read-only
    target = outside / "pwned.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')\n", limits=FAST)
    assert r.returncode != 0 and ("Read-only file system" in r.stderr or "denied" in r.stderr)
    assert not target.exists()
    inside = run_python("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())\n")
    assert inside.returncode == 0 and inside.stdout.strip() == "ok"


def test_socket_cannot_reach_the_host(isolated) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        r = run_python(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
            limits=FAST,
        )
        assert r.returncode != 0 and "OSError" in r.stderr
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever connected


def test_memory_hog_fails() -> None:
    r = run_python(
        "x = bytearray(1 << 31)\n", limits=dataclasses.replace(FAST, memory_bytes=1 << 28)
    )
    assert r.returncode != 0 and "MemoryError" in r.stderr


def test_misbehaving_humaneval_replies_are_scored_failed(humaneval, tmp_path, isolated) -> None:
    q = humaneval["HumanEval/0"]
    head = "def has_close_elements(numbers, threshold):\n"
    for body in (
        "    while True: pass\n",
        "    import os\n    while True: os.fork()\n",
        f"    open({str(tmp_path / 'x')!r}, 'w').write('x')\n    return True\n",
        "    import socket\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n",
        "    import sys\n    sys.exit(0)\n",  # exits early with status 0: no nonce, no pass
    ):
        s = humaneval_score(q, f"```python\n{head}{body}```", limits=FAST)
        assert s.correct is False, body


def test_extract_code_prefers_the_last_block_with_a_def() -> None:
    text = "```python\nx = 1\n```\n```python\ndef f():\n    return 2\n```\n```\nf()\n```"
    assert extract_code(text).startswith("def f()")
    assert extract_code("no fences at all") == "no fences at all"


def test_build_program_keeps_prompt_helpers(humaneval) -> None:
    q = humaneval["HumanEval/1"]
    program = build_program(q, "def separate_paren_groups(s):\n    return []\n")
    assert program.startswith(q.question) and program.rstrip().endswith("return []")


def test_incomplete_isolation_is_loud_and_strict_mode_refuses(monkeypatch, capsys, caplog):
    weak = code_sandbox.RunResult(0, "", "", False, 0.1, {"user_ns": False, "errors": ["EPERM"]})
    monkeypatch.setattr(code_sandbox, "_warned", set())
    with caplog.at_level(logging.WARNING):
        code_sandbox._report_isolation(weak)
    assert "isolation is INCOMPLETE" in caplog.text and "user_ns" in caplog.text
    assert "WARNING: code sandbox" in capsys.readouterr().err
    monkeypatch.setattr(code_sandbox, "isolation_probe", lambda: weak)
    monkeypatch.setenv("MOA_PD_SANDBOX", "strict")
    with pytest.raises(code_sandbox.SandboxUnavailable, match="refusing to run untrusted code"):
        run_python("print('never runs')")
