"""Run untrusted Python (a model's code and its tests) in a separate, confined process.

Each call gets a fresh scratch directory as its cwd and a child process, never the caller's
process. The child has wall-clock, CPU, memory (RLIMIT_AS), file-size and process-count limits,
and runs in new user, network, mount, pid and IPC namespaces (sandbox_child.py): no network
interface but a down loopback, every mount read-only except the scratch directory, and the
whole process tree killed with it. When the kernel refuses a namespace the run goes on with
what it has and says so: a WARNING on the log, and `RunResult.isolation` lists what is missing.
Set MOA_PD_SANDBOX=strict to refuse such runs instead.
The namespaces are entered with ctypes unshare(2) and not with bubblewrap or nsjail. Those are
Debian packages that CI and pip installs lack, while unshare(2) needs only the kernel (unprivileged
user namespaces, on by default in Debian and most distributions) and the standard library.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

_CHILD = Path(__file__).with_name("sandbox_child.py")
# The uid the sandbox runs as when the caller is root: RLIMIT_NPROC does not bind uid 0, and
# an unprivileged uid cannot write the caller's files even where a mount stays writable.
_NOBODY = "nobody"
_FULL = ("user_ns", "net_ns", "pid_ns", "fs_readonly", "nproc_enforced")
_warned: set[tuple[str, ...]] = set()


class SandboxUnavailable(RuntimeError):
    """MOA_PD_SANDBOX=strict and this machine cannot isolate the run completely."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-run limits. `max_procs` counts processes beyond those the sandbox uid already has."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    max_procs: int = 16
    output_bytes: int = 64 << 10  # stdout/stderr kept per stream (the rest is cut)


@dataclass(slots=True)
class RunResult:
    """`returncode` is 128 + signal for a signalled program, None when the wall clock ran out."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    isolation: dict = field(default_factory=dict)

    @property
    def missing_isolation(self) -> list[str]:
        return [k for k in _FULL if not self.isolation.get(k)]


def run_python(source: str, *, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Run `source` as `main.py` in a new scratch directory; the directory is removed after."""
    if os.environ.get("MOA_PD_SANDBOX") == "strict":
        _require_full_isolation()
    return _run_python(source, stdin, limits or Limits())


def _run_python(source: str, stdin: str, limits: Limits) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="moa-pd-sandbox-") as outer:
        # `outer` (caller-only) holds the output files; `outer/scratch` is the program's cwd.
        scratch = Path(outer) / "scratch"
        scratch.mkdir()
        program = scratch / "main.py"
        program.write_text(source, encoding="utf-8")
        user = _sandbox_user()
        if user is not None:
            os.chmod(outer, 0o711)  # nobody may pass through to its scratch, not list it
            for path in (scratch, program):
                os.chown(path, user.pw_uid, user.pw_gid)
        python = _interpreter(user)
        status_r, status_w = os.pipe()
        cfg = {
            "scratch": str(scratch),
            "program": str(program),
            "python": python,
            "status_fd": status_w,
            "isolate": True,
            "memory_bytes": limits.memory_bytes,
            "cpu_s": limits.cpu_s,
            "file_bytes": limits.file_bytes,
            "max_procs": limits.max_procs,
        }
        out_path, err_path = Path(outer) / "stdout", Path(outer) / "stderr"
        start = time.monotonic()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _CHILD.read_text(encoding="utf-8"), json.dumps(cfg)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=scratch,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                pass_fds=(status_w,),
                start_new_session=True,  # one process group to kill, whatever the program does
                user=None if user is None else user.pw_uid,
                group=None if user is None else user.pw_gid,
                extra_groups=None if user is None else [],
            )
            os.close(status_w)
            timed_out = _wait(proc, stdin, limits.wall_s)
        wall = time.monotonic() - start
        with os.fdopen(status_r, "rb") as f:
            raw_status = f.read()
        isolation = json.loads(raw_status) if raw_status else {"errors": ["bootstrap failed"]}
        result = RunResult(
            returncode=None if timed_out else proc.returncode,
            stdout=_head(out_path, limits.output_bytes),
            stderr=_head(err_path, limits.output_bytes),
            timed_out=timed_out,
            wall_s=wall,
            isolation=isolation,
        )
    _report_isolation(result)
    return result


def _wait(proc: subprocess.Popen, stdin: str, wall_s: float) -> bool:
    """Feed stdin and wait; past `wall_s` kill the group. True when the wall clock ran out."""
    try:
        proc.communicate(stdin.encode(), timeout=wall_s)
        return False
    except subprocess.TimeoutExpired:
        # The bootstrap's death takes the pid namespace with it (PDEATHSIG on its pid 1).
        _kill_group(proc.pid)
        proc.wait()
        return True
    finally:
        _kill_group(proc.pid)  # leftovers of a run without a pid namespace


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _head(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _sandbox_user() -> pwd.struct_passwd | None:
    """The unprivileged user to switch to when running as root; None when not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(_NOBODY)
    except KeyError:
        return None  # reported as nproc_enforced=False by the child


def _interpreter(user: pwd.struct_passwd | None) -> str:
    """A Python the sandbox user can run: ours, unless it lives where that user cannot reach
    (a root-only pyenv), then the system's."""
    ours = os.path.realpath(sys.executable)
    if user is None or _world_usable(ours):
        return sys.executable
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and _world_usable(os.path.realpath(system)):
        return system
    raise SandboxUnavailable(
        f"no Python interpreter that user {user.pw_name!r} may run: {ours} is not "
        "world-readable; install python3 under /usr/bin or run as a non-root user"
    )


def _world_usable(path: str) -> bool:
    """Every directory above `path` is world-searchable and the file world-executable."""
    p = Path(path)
    for parent in p.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(p).st_mode & stat.S_IXOTH)


@functools.cache
def isolation_probe() -> RunResult:
    """One harmless run, cached: what this machine's sandbox isolates."""
    # Not through run_python: the probe must not require the probe (in strict mode).
    return _run_python("pass", "", Limits())


def _require_full_isolation() -> None:
    missing = isolation_probe().missing_isolation
    if missing:
        raise SandboxUnavailable(
            f"MOA_PD_SANDBOX=strict: this machine's sandbox lacks {', '.join(missing)}; "
            "refusing to run untrusted code (unset MOA_PD_SANDBOX to run with a warning)"
        )


def _report_isolation(result: RunResult) -> None:
    missing = tuple(result.missing_isolation)
    if not missing:
        return
    message = (
        f"code sandbox: isolation is INCOMPLETE on this machine, missing {', '.join(missing)} "
        f"({'; '.join(result.isolation.get('errors', [])) or 'no detail'}). Untrusted code ran "
        "with only rlimits, a scratch cwd and a killed process group for what is missing. "
        "Enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on "
        "Ubuntu kernel.apparmor_restrict_unprivileged_userns=0) for full isolation."
    )
    if missing not in _warned:  # once per process and kind of gap, not once per sample
        _warned.add(missing)
        logger.warning(message)
        print(f"WARNING: {message}", file=sys.stderr)
