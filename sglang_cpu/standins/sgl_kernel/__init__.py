"""Import-time stand-in for `sgl_kernel` in .venv-sglang (CPU only; see sglang_cpu/README).

Why it exists: no CPU build of sgl-kernel installs from PyPI, and SGLang 0.5.23 with
SGLANG_USE_CPU_ENGINE=1 imports these names when its modules load (e.g.
sglang/kernels/ops/kvcache/cache_move.py imports copy_all_layer_kv_cache_cpu while resolving the
server arguments). On a CPU without AMX SGLang runs native torch code instead and never calls
them. Every name here raises when called, so a test can never pass on a stand-in: a call is a
loud error, never a silently wrong result.
"""

__version__ = "0.0.0+moa-pd-cpu-standin"

# The full list, found by starting SGLang's server, PD prefill and PD decode until no ImportError
# was left.
NAMES = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
)


class StandInCalled(NotImplementedError):
    """A stand-in kernel was called: this SGLang path needs the real sgl-kernel."""


def _stand_in(name: str):
    def kernel(*args, **kwargs):
        raise StandInCalled(
            f"sgl_kernel.{name} is moa-pd's import-only CPU stand-in and was called: this SGLang "
            f"code path needs a real sgl-kernel build (an AMX CPU or a GPU)"
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


for _name in NAMES:
    globals()[_name] = _stand_in(_name)
