"""Proof that a process never touched a path, where an answer alone cannot tell: `OpenWatch`
lists the files (and directories) opened, read or listed in some directories meanwhile, by any
process (Linux inotify); `fifo_tripwire` is a FIFO whose opening would hang a reader, released
after a while with bytes that are no JSON, so a test that opens it fails loudly instead of
hanging. Used by tests/test_routing_files.py and tests/test_real_processes_safety.py."""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from typing_extensions import Self

IN_ACCESS, IN_OPEN = 0x1, 0x20
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then the name, NUL-padded


class OpenWatch:
    """`with OpenWatch(d1, d2) as w: ...; w.touched()` → the paths opened or read in d1, d2
    (the directory itself where it was listed) since the watch began or `touched` was last
    called, in order."""

    def __init__(self, *dirs: str | Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._dirs: dict[int, str] = {}
        for d in dirs:
            wd = libc.inotify_add_watch(self._fd, os.fsencode(str(d)), IN_ACCESS | IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d} failed")
            self._dirs[wd] = str(d)

    def touched(self) -> list[str]:
        seen: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return seen
            off = 0
            while off < len(data):
                wd, _mask, _cookie, n = _EVENT.unpack_from(data, off)
                name = data[off + _EVENT.size : off + _EVENT.size + n].rstrip(b"\0").decode()
                seen.append(os.path.join(self._dirs[wd], name) if name else self._dirs[wd])
                off += _EVENT.size + n

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def fifo_tripwire(path: Path, release_after_s: float = 5.0) -> Iterator[Path]:
    """A FIFO at `path`. Whoever opens it for reading blocks, until, within `release_after_s`,
    this writes `b"opened"` to it: the reader then goes on with bytes that are no JSON."""
    os.mkfifo(path)
    stop = threading.Event()

    def release() -> None:
        while not stop.wait(release_after_s):
            try:  # succeeds only while someone has it open for reading
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            os.write(fd, b"opened")
            os.close(fd)

    thread = threading.Thread(target=release, name="fifo-tripwire", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join()
