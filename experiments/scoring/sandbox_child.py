"""Sandbox bootstrap, run as `python -I -S -c <this file's text> <config json>` by code_sandbox.

Stdlib only, no project imports: it may run under another uid with another interpreter. It enters
new user, mount, network, pid and IPC namespaces (ctypes unshare(2)), remounts every mount
read-only except the scratch directory, reports what it achieved on the status fd, then forks the
program (pid 1 of the new pid namespace) under resource limits and execs it, which drops the
namespace capabilities because the mapped uid is not 0.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_PDEATHSIG = 1
# Per-mount flags that a less privileged namespace may not clear: a remount must repeat them.
_KEPT = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, flags):
    src = source.encode() if source else None
    _check(libc.mount(src, target.encode(), None, flags, None), f"mount {target}")


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _enter_namespaces(uid, gid):
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
    _check(libc.unshare(flags), "unshare")
    # Map our own uid/gid only: inside we keep the namespace's capabilities until exec, and
    # the program (uid != 0 inside) loses them at exec.
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _mounts():
    """(mount id, mount point, per-mount options) from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")  # \040 for a space
            out.append((parts[0], point, parts[5].split(",")))
    return out


def _readonly_except(scratch):
    """Every mount read-only except a fresh bind of `scratch`; return the mounts that failed."""
    _mount(None, "/", MS_REC | MS_PRIVATE)  # nothing we do propagates back to the host
    _mount(scratch, scratch, MS_BIND | MS_REC)
    failed = []
    for _mid, point, opts in _mounts():
        if point == scratch or point.startswith(scratch.rstrip("/") + "/"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in opts:
            flags |= _KEPT.get(opt, 0)
        try:
            _mount(None, point, flags)
        except OSError as exc:
            if "ro" not in opts:
                failed.append(f"{point}: {exc.strerror}")
    return failed


def _count_procs(uid):
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                st = os.stat(f"/proc/{pid}")
            except OSError:
                continue
            n += st.st_uid == uid
    return n


def main():
    cfg = json.loads(sys.argv[1])
    scratch, uid, gid = cfg["scratch"], os.getuid(), os.getgid()
    status = {"user_ns": False, "net_ns": False, "pid_ns": False, "fs_readonly": False}
    errors = []
    # RLIMIT_NPROC counts every process of the real uid, not just ours: allow those already
    # running (other samples scored in parallel) plus the sample's own budget.
    nproc = _count_procs(uid) + cfg["max_procs"]
    if cfg["isolate"]:
        try:
            _enter_namespaces(uid, gid)
            status.update(user_ns=True, net_ns=True, pid_ns=True)
            failed = _readonly_except(scratch)
            status["fs_readonly"] = not failed
            errors += failed
        except OSError as exc:
            errors.append(str(exc))
    status["errors"] = errors
    status["nproc_enforced"] = uid != 0  # the kernel exempts uid 0 from RLIMIT_NPROC
    os.write(cfg["status_fd"], json.dumps(status).encode())
    os.close(cfg["status_fd"])
    pid = os.fork()  # the first child is pid 1 of the new pid namespace
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # bootstrap killed: we die too
        limits = [
            (resource.RLIMIT_AS, cfg["memory_bytes"]),
            (resource.RLIMIT_CPU, cfg["cpu_s"]),
            (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NPROC, nproc),
        ]
        try:
            for which, value in limits:
                hard = resource.getrlimit(which)[1]
                value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(which, (value, value))
            os.chdir(scratch)
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch}
            os.execve(cfg["python"], [cfg["python"], "-I", "-S", "-B", cfg["program"]], env)
        except (OSError, ValueError) as exc:  # limits or exec failed: say why, exit like a shell
            os.write(2, f"sandbox: {exc}\n".encode())
        os._exit(127)
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    # Exit as the program did; a signal shows as 128 + signal number, as a shell reports it.
    sys.exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
