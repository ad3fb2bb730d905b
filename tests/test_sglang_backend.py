"""The real-SGLang backend's launch side on CPU: command lines, --dry-run, dispatch, the pair CLI."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launch.ports import free_port
from sglang_ext import launch_server
from sglang_ext.sglang_backend.__main__ import main as pair_main
from sglang_ext.sglang_backend.pair import PDPairSpec, pd_pair_commands, worker_command

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _spec(**kw):
    base = {
        "model_path": "/m",
        "python": "py",
        "prefill_port": 31000,
        "decode_port": 31001,
        "router_port": 31002,
        "router_metrics_port": 31003,
        "bootstrap_port": 31004,
    }
    return PDPairSpec(**{**base, **kw})


def test_pd_pair_commands_are_exact():
    cmds = pd_pair_commands(
        _spec(
            ib_device="mlx5_0",
            mem_fraction_static=0.35,
            schedule_conservativeness=0.3,
            load_format="dummy",
            skip_tokenizer_init=True,
            decode_gpu=0,
            prefill_args=("--chunked-prefill-size", "4096"),
        )
    )
    assert list(cmds) == ["prefill", "decode", "router"]
    common = [
        "--disaggregation-transfer-backend",
        "nixl",
        "--disaggregation-bootstrap-port",
        "31004",
        "--base-gpu-id",
        "0",
        "--tp-size",
        "1",
        "--disaggregation-ib-device",
        "mlx5_0",
        "--mem-fraction-static",
        "0.35",
        "--schedule-conservativeness",
        "0.3",
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
    ]
    head = [
        "py",
        "-m",
        "sglang_ext.launch_server",
        "--backend",
        "sglang",
        "--model-path",
        "/m",
        "--host",
        "127.0.0.1",
    ]
    assert cmds["prefill"] == head + [
        "--port",
        "31000",
        "--disaggregation-mode",
        "prefill",
        *common,
        "--chunked-prefill-size",
        "4096",
    ]
    assert cmds["decode"] == head + ["--port", "31001", "--disaggregation-mode", "decode", *common]
    assert cmds["router"] == [
        "py",
        "-m",
        "launch.native_router",
        "--pd-disaggregation",
        "--prefill",
        "http://127.0.0.1:31000",
        "31004",
        "--decode",
        "http://127.0.0.1:31001",
        "--host",
        "127.0.0.1",
        "--port",
        "31002",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "31003",
    ]


def test_optional_flags_are_left_to_sglang_defaults():
    cmd = worker_command(_spec(), "decode")
    for flag in (
        "--disaggregation-ib-device",
        "--mem-fraction-static",
        "--load-format",
        "--schedule-conservativeness",
        "--skip-tokenizer-init",
    ):
        assert flag not in cmd
    assert cmd[cmd.index("--base-gpu-id") + 1] == "1"


def test_wildcard_bind_is_reached_through_loopback():
    spec = _spec(host="0.0.0.0")
    router = pd_pair_commands(spec)["router"]
    assert "http://127.0.0.1:31000" in router and router[router.index("--host") + 1] == "0.0.0.0"


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"decode_port": 31000}, "distinct"),
        ({"router_port": 0}, "1..65535"),
        ({"transfer_backend": "fake"}, "fake"),
        ({"mem_fraction_static": 1.5}, "mem_fraction_static"),
        ({"tp_size": 0}, "tp_size"),
    ],
)
def test_bad_specs_are_refused(kw, needle):
    with pytest.raises(ValueError, match=needle):
        _spec(**kw)
    with pytest.raises(ValueError, match="role"):
        worker_command(_spec(), "router")


def test_dry_run_prints_the_exact_command_lines(capsys):
    argv = [
        "--model-path",
        "/models/qwen3",
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--disaggregation-ib-device",
        "mlx5_1",
        "--decode-gpu",
        "3",
        "--prefill-extra",
        "--chunked-prefill-size 2048",
        "--dry-run",
    ]
    assert pair_main(argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    spec = PDPairSpec(
        model_path="/models/qwen3",
        load_format="dummy",
        skip_tokenizer_init=True,
        ib_device="mlx5_1",
        decode_gpu=3,
        prefill_args=("--chunked-prefill-size", "2048"),
    )
    assert [shlex.split(ln) for ln in lines] == list(pd_pair_commands(spec).values())


def test_dry_run_resolves_a_dummy_shape(capsys):
    from sglang_ext.engine.model_store import resolve_model_path

    assert pair_main(["--model-path", "dummy:qwen3-tiny", "--dry-run"]) == 0
    workers = [shlex.split(ln) for ln in capsys.readouterr().out.splitlines()[1:4:2]]
    for argv in workers:
        assert argv[argv.index("--model-path") + 1] == resolve_model_path("dummy:qwen3-tiny")
        assert argv[argv.index("--load-format") + 1] == "dummy"
    assert pair_main(["--model-path", "dummy:qwen3-9b", "--dry-run"]) == 2
    assert "unknown model shape 'qwen3-9b'" in capsys.readouterr().err


def test_dry_run_rejects_a_bad_pair(capsys):
    assert pair_main(["--model-path", "m", "--decode-port", "30000", "--dry-run"]) == 2
    assert "distinct" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "backend", "rest"),
    [
        ([], "torch", []),
        (["--model-path", "m", "--port", "1"], "torch", ["--model-path", "m", "--port", "1"]),
        (["--backend", "sglang", "--help"], "sglang", ["--help"]),
        (["--backend=torch", "--b", "x"], "torch", ["--b", "x"]),  # no abbreviation swallowing
    ],
)
def test_backend_flag_is_split_off(argv, backend, rest):
    assert launch_server.split_backend(argv) == (backend, rest)


def test_sglang_backend_dry_run_runs_without_sglang():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_ext.launch_server",
            "--backend",
            "sglang",
            "--dry-run",
            "--model-path",
            "/m",
            "--disaggregation-mode",
            "prefill",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "patch prefill_only_route [main]" in out
    assert (
        out.strip()
        .splitlines()[-1]
        .endswith(
            "-m sglang.launch_server --model-path /m --disaggregation-mode prefill "
            "--enable-metrics"  # the meta_info timings of the PD breakdown
        )
    )


def test_pair_cli_stops_its_processes_on_sigterm(tmp_path):
    """`python -m sglang_ext.sglang_backend` runs through launch.procs: a worker that dies at
    start-up is reported with its log, and nothing it started is left running."""
    argv = [
        sys.executable,
        "-m",
        "sglang_ext.sglang_backend",
        "--model-path",
        str(tmp_path),
        "--prefill-port",
        str(free_port()),
        "--decode-port",
        str(free_port()),
        "--router-port",
        str(free_port()),
        "--router-metrics-port",
        str(free_port()),
        "--disaggregation-bootstrap-port",
        str(free_port()),
        "--log-dir",
        str(tmp_path / "l"),
        "--startup-timeout",
        "60",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV, check=False)
    assert out.returncode == 1
    assert "exited with code" in out.stderr and "prefill" in out.stderr
