"""Which SGLang releases the patch supports, and the check that refuses the others.

Called by `sglang_ext.patch.apply` and the `--backend sglang` worker before SGLang is imported.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version

# Read in the released wheels: 0.5.3 (no plugin system, fake-host prefills are cached) through
# 0.5.23 (the newest release when this was written). Anything newer is untested: the one line the
# warm-up patch depends on (Req.__init__ setting skip_radix_cache_insert) may have moved.
MIN_SUPPORTED = Version("0.5.3")
MAX_SUPPORTED = Version("0.5.23")
INSTALL_HINT = (
    "pip install -e '.[sglang]' (installs sglang>=0.5.3,<0.5.24) on a CUDA machine, "
    "or `make test-sglang` (builds .venv-sglang) on a CPU"
)


class UnsupportedSGLangVersion(RuntimeError):
    """The installed (or given) SGLang is outside the range the patch was written against."""


def parse_version(version: str) -> Version:
    """Parse `version` (PEP 440) or raise UnsupportedSGLangVersion naming it."""
    try:
        return Version(version)
    except InvalidVersion as e:
        raise UnsupportedSGLangVersion(f"cannot parse SGLang version {version!r}: {e}") from e


def release(version: str) -> tuple[int, int, int]:
    """(major, minor, micro) of `version`: a post release counts as its base (0.5.23.post1)."""
    parts = parse_version(version).release + (0, 0)
    return parts[0], parts[1], parts[2]


def check_version(version: str) -> tuple[int, int, int]:
    """Return the release tuple of a supported version; raise UnsupportedSGLangVersion otherwise."""
    rel = release(version)
    if not (MIN_SUPPORTED.release <= rel <= MAX_SUPPORTED.release):
        raise UnsupportedSGLangVersion(
            f"SGLang {version} is not supported by moa-pd's patch (supported: {MIN_SUPPORTED} to "
            f"{MAX_SUPPORTED}); install a supported release with: {INSTALL_HINT}"
        )
    return rel


def installed_version() -> str:
    """The installed SGLang's version, read from package metadata (no import of sglang)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError as e:
        raise UnsupportedSGLangVersion(
            f"SGLang is not installed in this environment; {INSTALL_HINT}, "
            "or use --backend torch (the CPU reference engine)"
        ) from e
