"""The CPU stand-ins of .venv-sglang (sglang_cpu/standins/): every stand-in kernel raises when
called, so no test can pass on one; the NIXL relabel turns VRAM into DRAM and nothing else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sglang_ext.patch.cpu_nixl import dram

STANDINS = Path(__file__).resolve().parent.parent / "sglang_cpu" / "standins"


def load_stand_in_kernels():
    spec = importlib.util.spec_from_file_location(
        "moa_pd_test_sgl_kernel", STANDINS / "sgl_kernel" / "__init__.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_stand_in_kernel_raises_when_called():
    mod = load_stand_in_kernels()
    assert len(mod.NAMES) == 8
    for name in mod.NAMES:
        with pytest.raises(NotImplementedError, match=f"sgl_kernel.{name} is moa-pd's"):
            getattr(mod, name)(1, 2, key=3)


def test_nixl_memory_kinds_on_the_cpu_engine():
    assert dram(["VRAM", "DRAM", "VRAM"]) == ["DRAM", "DRAM", "DRAM"]
    assert dram([]) == []


def test_torchvision_shim_is_loaded_by_its_pth_file():
    assert (STANDINS / "moa_pd_torchvision_ops.pth").read_text().strip() == (
        "import moa_pd_torchvision_ops"
    )
