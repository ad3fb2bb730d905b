"""Hooks applied to real SGLang at start-up, one module per behaviour change, plus the plan.

`apply(version)` runs them (called by the `--backend sglang` worker); `patch_plan(version)` says
which a version needs, without importing SGLang.
"""

from sglang_ext.patch.apply import PatchNotReachable, apply
from sglang_ext.patch.plan import Patch, dp_rank_field, patch_plan
from sglang_ext.patch.version import UnsupportedSGLangVersion, check_version

__all__ = [
    "Patch",
    "PatchNotReachable",
    "UnsupportedSGLangVersion",
    "apply",
    "check_version",
    "dp_rank_field",
    "patch_plan",
]
