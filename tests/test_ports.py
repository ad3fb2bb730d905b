"""Ports that cannot be stolen (launch/ports.py): chosen outside the kernel's ephemeral range,
and a port another process takes between the choice and the start is replaced everywhere it
is recorded; several deployments started at once all come up."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
from tiny_models import tiny_model_dir

import launch.ports
import launch.stack
from launch.commands import make_stack
from launch.ports import (
    PortBook,
    candidate_ranges,
    ephemeral_range,
    free_port,
    port_in_use,
    start_with_fresh_ports,
)
from launch.procs import LaunchError, ProcSpec, healthy, wait_routable
from tests.deployment_procs import cluster_ports, tiny_config

LINUX_DEFAULT = (32768, 60999)


def test_candidates_leave_out_the_ephemeral_range(tmp_path):
    assert candidate_ranges(LINUX_DEFAULT) == [range(10000, 32768), range(61000, 65536)]
    assert candidate_ranges((49152, 65535)) == [range(10000, 49152)]
    # Widened to (almost) everything: all of 10000..65535, and the retry alone protects.
    assert candidate_ranges((1024, 65000)) == [range(10000, 65536)]
    f = tmp_path / "ip_local_port_range"
    f.write_text("20000\t40000\n")
    assert ephemeral_range(f) == (20000, 40000)
    assert ephemeral_range(tmp_path / "missing") == launch.ports.IANA_EPHEMERAL


def test_free_port_is_outside_the_ephemeral_range_and_never_repeats(monkeypatch):
    monkeypatch.setattr(launch.ports, "ephemeral_range", lambda: (12000, 65000))
    ports = [free_port() for _ in range(200)]  # 2,000 candidates: repeats would show
    assert len(set(ports)) == 200
    assert all(10000 <= p < 12000 or p > 65000 for p in ports)
    lo, hi = ephemeral_range()
    with socket.socket() as s:  # what the kernel hands out by itself is never among them
        s.bind(("127.0.0.1", 0))
        assert lo <= s.getsockname()[1] <= hi


def test_port_book_renews_only_the_taken_ports():
    book = PortBook("127.0.0.1")
    a, b = book["m.prefill0"], book["m.decode0"]
    assert book["m.prefill0"] == a  # chosen once
    book.renew([a])
    assert book["m.prefill0"] not in (a, b) and book["m.decode0"] == b


def test_a_port_held_on_every_try_or_a_failure_of_another_kind_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = ProcSpec("w", [sys.executable, "-c", "pass"], None, ports=[port])
        renewed = []

        def renew(taken, names):  # a renewal that keeps getting a held port
            renewed.append(taken)
            return [spec]

        with pytest.raises(LaunchError, match=f"port {port} for w is already in use .*3 tries"):
            start_with_fresh_ports([spec], "127.0.0.1", lambda specs: None, renew)
        assert renewed == [[port], [port]]

    def fails(specs):
        raise LaunchError("w exited with code 1 during start-up")

    free = ProcSpec("w", [], None, ports=[free_port()])
    with pytest.raises(LaunchError, match="exited with code 1"):  # no port held: no retry
        start_with_fresh_ports([free], "127.0.0.1", fails, renew)
    assert len(renewed) == 2


def _stealing_start(monkeypatch, names: set[str]) -> dict[str, int]:
    """Make launch.stack's `start` take the first port of each named spec with a socket of ours
    just before its first start: the race of issue 19. Returns {name: stolen port}."""
    stolen: dict[str, int] = {}
    held: list[socket.socket] = []
    real_start = launch.stack.start

    def start(spec, log_dir, die_with_parent=True):
        if spec.name in names and spec.name not in stolen:
            s = socket.socket()
            s.bind(("127.0.0.1", spec.ports[0]))
            s.listen()
            held.append(s)
            stolen[spec.name] = spec.ports[0]
        return real_start(spec, log_dir, die_with_parent)

    monkeypatch.setattr(launch.stack, "start", start)
    return stolen


@pytest.mark.slow
@pytest.mark.deployment
def test_three_deployments_at_once_come_up_and_a_taken_port_is_replaced_everywhere(
    tmp_path, monkeypatch
):
    """Three deployments start at once: two `moa-pd up --detach` processes and one in this
    process (one test, since each deployment's start is most of its time). All come up on
    disjoint ports outside the ephemeral range. In the one here, a prefill worker's and the shell
    router's ports are taken between the choice and the start: each exits (it cannot bind), gets
    new ports, starts again, and the deployment serves, with the new ports in the plan, the
    sglang-router's command line and cluster.json."""
    config = tiny_config(tmp_path, model_path=tiny_model_dir("llama"))
    run_dirs = [tmp_path / f"dep{i}" for i in range(2)]
    cli = [sys.executable, "-m", "launch.cli"]
    ups = [
        subprocess.Popen(
            [*cli, "up", "--config", config, "--run-dir", str(d), "--detach"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for d in run_dirs
    ]
    clusters = []
    try:
        stolen = _stealing_start(monkeypatch, {"smollm2.prefill0", "shell_router"})
        with make_stack([config], "torch", tmp_path / "dep", "127.0.0.1") as stack:
            assert set(stolen) == {"smollm2.prefill0", "shell_router"}
            cluster = json.loads(stack.cluster_path.read_text())
            model = cluster["models"]["smollm2"]
            prefill_url = model["prefill_urls"][0]
            assert urlsplit(prefill_url).port == stack.models["smollm2"].prefill_ports[0]
            assert urlsplit(prefill_url).port != stolen["smollm2.prefill0"]
            shell = cluster["shell_router_url"]
            assert urlsplit(shell).port == stack.shell_router_port != stolen["shell_router"]
            procs = {
                p["name"]: p for p in json.loads((stack.run_dir / "processes.json").read_text())
            }
            router_argv = procs["smollm2.router"]["argv"]
            assert router_argv[router_argv.index("--prefill") + 1] == prefill_url
            assert list(model["processes"]) == [
                prefill_url,
                *model["decode_urls"],
                model["router_url"],
            ]
            wait_routable(model["router_url"], timeout_s=120)  # the router reaches the new ports
            assert healthy(shell + "/health")

            outputs = [p.communicate(timeout=280)[0] for p in ups]
            assert [p.returncode for p in ups] == [0, 0], "\n".join(outputs)
            clusters = [cluster] + [json.loads((d / "cluster.json").read_text()) for d in run_dirs]
            ports = [set(cluster_ports(c)) for c in clusters]
            assert sum(map(len, ports)) == len(set.union(*ports)) == 3 * 5  # none shared
            lo, hi = ephemeral_range()
            assert not [p for p in set.union(*ports) if lo <= p <= hi]
            for c in clusters[1:]:
                wait_routable(c["models"]["smollm2"]["router_url"], timeout_s=120)
                assert healthy(c["shell_router_url"] + "/health")
    finally:
        for p in ups:
            if p.poll() is None:
                p.kill()
        # Both at once, as they came up (each `moa-pd down` is a Python start-up).
        downs = [
            subprocess.Popen([*cli, "down", "--run-dir", str(d)])
            for d in run_dirs
            if (d / "processes.json").exists()
        ]
        for p in downs:
            p.wait()
    assert not [p for c in clusters for p in cluster_ports(c) if port_in_use(p)]
