"""Ports for a deployment's processes, chosen where the kernel never hands one out on its own:
outside its ephemeral range, at random, and kept by what each is for, so a port taken anyway
between the choice and the start can be replaced everywhere it is recorded."""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Callable
from pathlib import Path

from launch.procs import LaunchError, ProcSpec

log = logging.getLogger(__name__)

# Why not "bind port 0 and keep the number" (the old way): the kernel hands out the same pool
# (its ephemeral range) to every outgoing connection and port-0 bind on the machine, so an
# earlier-started worker's ZMQ/NIXL/UCX socket could take the port before its process started.
# Why not "each process binds port 0 and reports it": SGLang workers and the sglang-router
# binary are not ours and take their ports on the command line. Outside the ephemeral range only
# explicit binders collide (another deployment, SGLang's own port+N choices), and
# `start_with_fresh_ports` starts those again with new ports.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# IANA's dynamic range: the ephemeral range of macOS and Windows, and the guess where Linux's
# file cannot be read.
IANA_EPHEMERAL = (49152, 65535)
# Services users run (3000, 5432, 6379, 8000, 8080, ...) mostly listen below this.
LOWEST = 10000
# Fewer free ports than this outside the ephemeral range (someone widened it): draw from all of
# LOWEST..65535 and rely on the retry alone.
MIN_CANDIDATES = 1000
# Starts of one phase in all: each retry draws new ports at random, so a second collision is
# already unlikely.
PORT_TRIES = 3

_rng = random.Random()  # its own seed: a test seeding `random` must not make runs pick alike
_handed_out: set[int] = set()  # never the same port twice from one process (several deployments)


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), both inclusive."""
    try:
        lo, hi = map(int, path.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return IANA_EPHEMERAL


def candidate_ranges(ephemeral: tuple[int, int]) -> list[range]:
    """The ports to choose from: LOWEST..65535 minus the ephemeral range."""
    lo, hi = ephemeral
    ranges = [range(LOWEST, min(lo, 65536)), range(max(hi + 1, LOWEST), 65536)]
    ranges = [r for r in ranges if len(r)]
    if sum(map(len, ranges)) < MIN_CANDIDATES:
        return [range(LOWEST, 65536)]
    return ranges


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        # SO_REUSEADDR: a port whose last connection sits in TIME_WAIT is free to listen on.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody holds now, outside the ephemeral range, not handed out before by this
    process."""
    ranges = candidate_ranges(ephemeral_range())
    for _ in range(1000):
        (r,) = _rng.choices(ranges, weights=[len(r) for r in ranges])
        port = _rng.choice(r)
        if port not in _handed_out and not port_in_use(port, host):
            _handed_out.add(port)
            return port
    raise LaunchError(f"no free port on {host} among {ranges} after 1000 tries")


class PortBook:
    """One deployment's ports by what each is for ("smollm2.prefill0", "shell_router"), chosen
    on first use. `renew` replaces ports someone else took; whatever reads the book afterwards
    (plans, command lines, cluster.json) gets the new ones."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._ports: dict[str, int] = {}

    def __getitem__(self, key: str) -> int:
        if key not in self._ports:
            self._ports[key] = free_port(self.host)
        return self._ports[key]

    def renew(self, taken: list[int]) -> None:
        for key, port in self._ports.items():
            if port in taken:
                self._ports[key] = free_port(self.host)


def start_with_fresh_ports(
    specs: list[ProcSpec],
    host: str,
    start_all: Callable[[list[ProcSpec]], None],
    renew: Callable[[list[int], list[str]], list[ProcSpec]],
    tries: int = PORT_TRIES,
) -> None:
    """start_all(specs): start them and wait until healthy (on failure it stops them and raises
    LaunchError). Where a port of specs is held by another process, before the start or after a
    failed one, renew(taken ports, spec names) chooses new ones and returns the specs rebuilt
    with them, and they start again: `tries` starts in all."""
    for attempt in range(1, tries + 1):
        taken = [p for s in specs for p in s.ports if port_in_use(p, host)]
        if not taken:
            try:
                return start_all(specs)
            except LaunchError:
                taken = [p for s in specs for p in s.ports if port_in_use(p, host)]
                if not taken:
                    raise  # not a port: the error says what
        owner = next(s.name for s in specs if taken[0] in s.ports)
        if attempt == tries:
            raise LaunchError(
                f"port {taken[0]} for {owner} is already in use on {host} ({tries} tries with "
                "new ports); stop what holds it or retry"
            )
        log.warning("port %d for %s was taken by another process: new ports", taken[0], owner)
        specs = renew(taken, [s.name for s in specs])
