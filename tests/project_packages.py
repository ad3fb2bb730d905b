"""The project's top-level packages, for tests that read every module of them."""

from __future__ import annotations

# What users run: the product. benchmarks/ uses it and is never imported by it.
PRODUCT_PACKAGES = (
    "sglang_ext",
    "router",
    "routing",
    "launch",
    "planning",
    "profiling",
    "simulation",
    "experiments",
)
ALL_PACKAGES = (*PRODUCT_PACKAGES, "benchmarks")
