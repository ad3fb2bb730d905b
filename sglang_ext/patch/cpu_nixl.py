"""On SGLang's CPU engine, register the KV pool with NIXL as host memory ("DRAM"), not "VRAM".

SGLang 0.5.23 labels every KV region "VRAM" for NIXL (disaggregation/nixl/conn.py:
`_normalize_kv_mem_kinds` defaults to it, and decode.py passes ["VRAM"] * n). With
SGLANG_USE_CPU_ENGINE=1 the pool is host memory, and UCX built without CUDA refuses a VRAM
registration ("VRAM memory is detected as host by UCX"), so a PD pair cannot start. The label is
all that is wrong; relabelling it is what the memory is. Called from our scheduler plugin (the
process that owns the KV pool), only when SGLANG_USE_CPU_ENGINE=1.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
CONN_MODULE = "sglang.srt.disaggregation.nixl.conn"


def dram(kinds: list[str]) -> list[str]:
    """["VRAM", "DRAM"] -> ["DRAM", "DRAM"]: the memory kinds as they are on the CPU engine."""
    return ["DRAM" if k == "VRAM" else k for k in kinds]


def register_kv_as_dram() -> None:
    import importlib

    conn = importlib.import_module(CONN_MODULE)
    if getattr(conn, "_moa_pd_dram", False):
        return
    normalize, unpack = conn._normalize_kv_mem_kinds, conn._unpack_kv_mem_kinds
    conn._normalize_kv_mem_kinds = lambda kinds, n: dram(normalize(kinds, n))
    conn._unpack_kv_mem_kinds = lambda buf, n: dram(unpack(buf, n))
    conn._moa_pd_dram = True
    logger.warning(
        "moa-pd: SGLang CPU engine: NIXL registers the KV pool as DRAM (pid %d)", os.getpid()
    )
