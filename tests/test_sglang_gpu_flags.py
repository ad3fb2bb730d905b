"""The attention flags of SGLang workers on GPUs (sglang_ext/sglang_backend/gpu.py), on CPU: FA3
is found in the installed sgl_kernel (its `flash_ops` library) and on sm90 GPUs (a fake
nvidia-smi); without it `moa-pd up` and the microbench give every GPU worker triton attention,
PyTorch sampling and no CUDA graph, leaving a flag the config sets to the config."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from launch.stack import Stack
from router.config_loader import load_config
from sglang_ext.sglang_backend import gpu


@pytest.fixture(autouse=True)
def fresh_detection():
    gpu.fa3_library_installed.cache_clear()
    gpu.gpus_are_hopper.cache_clear()
    yield
    gpu.fa3_library_installed.cache_clear()
    gpu.gpus_are_hopper.cache_clear()


def fake_sgl_kernel(root, monkeypatch, with_flash_ops: bool) -> None:
    pkg = root / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "common_ops.abi3.so").write_bytes(b"")
    if with_flash_ops:
        (pkg / "flash_ops.abi3.so").write_bytes(b"")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "sgl_kernel", raising=False)


def fake_nvidia_smi(root, monkeypatch, caps: list[str]) -> None:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {c}\n" for c in caps))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    "flash_ops,caps,backend",
    [
        (True, ["9.0"], "fa3"),
        (False, ["9.0"], "triton"),  # the trimmed offline wheel set
        (True, ["8.0"], "triton"),  # FA3 runs on sm90 only
        (True, ["9.0", "8.6"], "triton"),
    ],
)
def test_fa3_where_the_kernel_has_it_on_hopper(tmp_path, monkeypatch, flash_ops, caps, backend):
    fake_sgl_kernel(tmp_path, monkeypatch, flash_ops)
    fake_nvidia_smi(tmp_path, monkeypatch, caps)
    assert gpu.attention_backend() == backend
    assert gpu.worker_flags([]) == ([] if backend == "fa3" else list(gpu.TRITON_FLAGS))


def test_a_hanging_nvidia_smi_means_no_fa3_not_a_hang(tmp_path, monkeypatch):
    import time

    fake_sgl_kernel(tmp_path, monkeypatch, True)
    fake_nvidia_smi(tmp_path, monkeypatch, ["9.0"])
    script = tmp_path / "bin" / "nvidia-smi"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(gpu, "SMI_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    assert gpu.attention_backend() == "triton"
    assert time.monotonic() - t0 < 10


def test_no_sgl_kernel_means_triton(monkeypatch):
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: None)
    assert not gpu.fa3_library_installed()


def test_flags_the_config_sets_are_kept(monkeypatch):
    monkeypatch.setattr(gpu, "has_fa3", lambda: False)
    argv = ["python", "-m", "x", "--attention-backend", "flashinfer", "--disable-cuda-graph"]
    assert gpu.worker_flags(argv) == ["--sampling-backend", "pytorch"]
    assert gpu.worker_flags(["--attention-backend=flashinfer"]) == [
        "--sampling-backend",
        "pytorch",
        "--disable-cuda-graph",
    ]


def test_up_gives_gpu_workers_the_triton_flags_without_fa3(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "has_fa3", lambda: False)
    cfg = load_config("single_8b_dummy_gpu")
    stack = Stack([cfg], [], "sglang", tmp_path)  # unplaced: the flags do not depend on it
    stack.plan()
    specs = stack.worker_specs()
    assert {s.name for s in specs} == {"qwen3-8b.prefill0", "qwen3-8b.decode0"}
    for spec in specs:
        argv = spec.argv
        assert argv[argv.index("--attention-backend") + 1] == "triton"
        assert argv[argv.index("--sampling-backend") + 1] == "pytorch"
        assert "--disable-cuda-graph" in argv and "--device" not in argv
        assert argv[argv.index("--load-format") + 1] == "dummy"
        assert argv[argv.index("--model-path") + 1].endswith("dummy-qwen3-8b")
    monkeypatch.setattr(gpu, "has_fa3", lambda: True)
    assert all("--attention-backend" not in s.argv for s in stack.worker_specs())
