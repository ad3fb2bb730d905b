"""`make wheelhouse`: download the GPU stack of one SGLang release (the pinned sets in
launch/wheelhouse.toml) plus moa-pd's own wheel, on a machine that reaches a package index, for an
offline install on a GPU node (docs/gpu-offline.md). Optionally trims wheels and splits the
result into parts of at most N MiB for small transfer limits."""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PINS = Path(__file__).with_name("wheelhouse.toml")
REPO = Path(__file__).resolve().parent.parent


class WheelhouseError(RuntimeError):
    """Bad input or a failed step; the message says what to fix."""


def releases(path: Path = PINS) -> dict[str, dict]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise WheelhouseError("run it with Python 3.11 or newer (it reads TOML)") from None
    return tomllib.loads(path.read_text())["releases"]


def release(version: str, path: Path = PINS) -> dict:
    table = releases(path)
    if version not in table:
        raise WheelhouseError(
            f"no pinned wheel set for sglang {version} in {path}; known: {', '.join(table)} "
            "(add one: resolve `sglang==X sglang-router nixl` for the node's platform)"
        )
    return table[version]


def platform_tags(glibc: str) -> list[str]:
    """pip matches manylinux tags exactly: every manylinux_2_N up to the node's glibc, and the
    legacy alias of 2_17."""
    try:
        major, minor = (int(x) for x in glibc.split("."))
    except ValueError:
        raise WheelhouseError(f"--glibc {glibc!r}: give the node's glibc as 2.N, e.g. 2.35")
    if major != 2 or minor < 17:
        raise WheelhouseError(f"--glibc {glibc}: manylinux wheels need glibc 2.17 or newer")
    return [f"manylinux_2_{n}_x86_64" for n in range(minor, 16, -1)] + ["manylinux2014_x86_64"]


def download_argv(
    wheels: list[str], python: str, glibc: str, dest: Path, pip: list[str], deps: bool = False
) -> list[str]:
    """One `pip download` of `wheels` for the node's interpreter and platform: exactly these
    (the pinned sets are whole closures), or with their dependencies resolved (`deps`)."""
    argv = [*pip, "download", *([] if deps else ["--no-deps"]), "--only-binary=:all:"]
    argv += ["--python-version", python]
    argv += ["--implementation", "cp", "--dest", str(dest)]
    for tag in platform_tags(glibc):
        argv += ["--platform", tag]
    return argv + wheels


def trim_wheel(wheel: Path, patterns: list[str]) -> int:
    """Drop the files matching `patterns` from the wheel, and their RECORD rows, in place.
    Returns the bytes saved on disk."""
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".trim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        drop = {n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)}
        for info in src.infolist():
            if info.filename in drop:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines()
                data = "".join(r + "\n" for r in rows if r.split(",", 1)[0] not in drop).encode()
            dst.writestr(info, data)
    tmp.replace(wheel)
    return before - wheel.stat().st_size


def dist_key(wheel: Path) -> str:
    """A wheel file's distribution name, normalized as trim tables key it (sglang_kernel)."""
    return wheel.name.split("-", 1)[0].lower().replace(".", "_")


def split_parts(wheels: list[Path], max_mib: float) -> list[list[Path]]:
    """First-fit-decreasing into parts of at most max_mib each."""
    limit = max_mib * 2**20
    parts: list[tuple[int, list[Path]]] = []
    for w in sorted(wheels, key=lambda w: -w.stat().st_size):
        size = w.stat().st_size
        if size > limit:
            raise WheelhouseError(
                f"{w.name} alone is {size / 2**20:.1f} MiB, over --split-mib {max_mib:g}; "
                "raise the limit or trim it (--trim, launch/wheelhouse.toml)"
            )
        for i, (used, members) in enumerate(parts):
            if used + size <= limit:
                parts[i] = (used + size, members + [w])
                break
        else:
            parts.append((size, [w]))
    return [members for _, members in parts]


def build(args: argparse.Namespace) -> list[Path]:
    """Download (and trim, split) the release's wheels into args.out; their final paths."""
    rel = release(args.sglang)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pip = [args.pip_python, "-m", "pip"]
    wheels = list(rel["wheels"])
    if args.with_torch and not any(w.startswith("torch==") for w in wheels):
        # torch with its CUDA libraries (resolved: they are many), for a node without torch.
        torch = [f"torch=={rel['torch']}"]
        run(download_argv(torch, args.python, args.glibc, out, pip, deps=True))
    run(download_argv(wheels, args.python, args.glibc, out, pip))
    if not args.no_project:
        # setuptools builds in the tree: leave it as it was.
        leftovers = [p for p in (REPO / "moa_pd.egg-info", REPO / "build") if not p.exists()]
        run([*pip, "wheel", "--no-deps", "--wheel-dir", str(out), str(REPO)])
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
    if args.trim:
        for wheel in sorted(out.glob("*.whl")):
            patterns = rel.get("trim", {}).get(dist_key(wheel))
            if patterns:
                saved = trim_wheel(wheel, patterns)
                print(f"trimmed {wheel.name}: -{saved / 2**20:.1f} MiB")
    wheels_out = sorted(out.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels_out) / 2**20
    print(f"{len(wheels_out)} wheels, {total:.1f} MiB in {out}")
    if args.split_mib:
        moved = []
        for i, members in enumerate(split_parts(wheels_out, args.split_mib), 1):
            part = out / f"part{i}"
            part.mkdir(exist_ok=True)
            size = sum(w.stat().st_size for w in members) / 2**20
            moved += [Path(shutil.move(str(w), part / w.name)) for w in members]
            print(f"{part}: {len(members)} wheels, {size:.1f} MiB")
        wheels_out = sorted(moved)
    return wheels_out


def run(argv: list[str]) -> None:
    print("+", " ".join(argv[:12]) + (" ..." if len(argv) > 12 else ""), flush=True)
    if subprocess.run(argv, check=False).returncode != 0:
        raise WheelhouseError(f"{argv[0]} {' '.join(argv[1:4])} ... failed (its output is above)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.wheelhouse", description=__doc__)
    p.add_argument("--sglang", help="the SGLang release (see --list)")
    p.add_argument("--python", default="3.12", help="the node's Python, e.g. 3.12")
    p.add_argument("--glibc", default="2.35", help="the node's glibc (`ldd --version`)")
    p.add_argument("--out", default="wheelhouse", help="folder for the wheels")
    p.add_argument("--trim", action="store_true", help="drop the release's trim files")
    p.add_argument("--split-mib", type=float, help="move the wheels into partN/ folders this big")
    p.add_argument("--with-torch", action="store_true", help="add torch and its CUDA libraries")
    p.add_argument("--no-project", action="store_true", help="leave out moa-pd's own wheel")
    p.add_argument("--pip-python", default=sys.executable, help="the Python whose pip downloads")
    p.add_argument("--list", action="store_true", help="list the pinned releases and exit")
    args = p.parse_args(argv)
    try:
        if args.list or not args.sglang:
            for version, rel in releases().items():
                print(f"sglang {version}: torch {rel['torch']}, {len(rel['wheels'])} wheels")
                print(f"  the node must have: {rel['node']}")
            return 0 if args.list else 2
        build(args)
    except WheelhouseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
