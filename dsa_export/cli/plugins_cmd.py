"""``dsa-export plugins``: build the CUDA/TensorRT plugin libraries and find them."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.plugins import library as lib

MIN_CMAKE = (3, 24)


def _find_nvcc() -> str | None:
    candidates = [os.environ.get("CUDACXX")]
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _find_cxx() -> str | None:
    env = os.environ.get("CXX")
    if env:
        return shutil.which(env) or (env if os.path.isfile(env) else None)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _cmake_version(cmake: str) -> tuple[int, ...]:
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    return tuple(int(x) for x in match.groups()) if match else (0, 0)


def _parse_archs(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if value in {"native", "all", "all-major"}:
        return value
    archs = [a.strip().lower().removeprefix("sm_").replace(".", "") for a in re.split(r"[;,\s]+", value) if a.strip()]
    if not archs or not all(re.fullmatch(r"\d{2,3}[af]?", a) for a in archs):
        raise DSAUsageError(
            f"--cuda-arch {value!r} is not a list of CUDA architectures; use e.g. '90' or '80;90;100' or 'native'."
        )
    return ";".join(archs)


def _run_streaming(cmd: list[str], log_path: Path, quiet: bool) -> tuple[int, list[str]]:
    """Run cmd, echo its output to stderr (unless quiet), keep a log file and the last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=40)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip())
                if not quiet:
                    click.echo(line.rstrip(), err=True)
            return proc.wait(), list(tail)
        except BaseException:  # an interrupt stops the compiler too
            proc.kill()
            proc.wait()
            raise


@click.group(name="plugins")
def command() -> None:
    """Build the DSA CUDA kernels and TensorRT plugin libraries, and find them."""


@command.command(name="build")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="CMake build directory [default: plugins/build in a checkout, else ~/.cache/dsa-export/plugins].")
@click.option("--cuda-arch", default=None,
              help="CUDA architectures, e.g. '90' or '80;90;100' or 'native' [default: 80;86;89;90 plus 100;120 on CUDA >= 12.8].")
@click.option("--tensorrt-root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="TensorRT installation (include/ and lib/); headers alone build libdsa_plugins.so.")
@click.option("--tensorrt-include", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory holding NvInfer.h when it is not under --tensorrt-root.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Parallel build jobs [default: CPU count].")
@click.option("--build-type", type=click.Choice(["Release", "RelWithDebInfo", "Debug"]), default="Release",
              show_default=True)
@click.option("--warnings-as-errors", is_flag=True, help="Fail on compiler warnings in our sources.")
@click.option("--quiet", "-q", is_flag=True, help="Do not echo the CMake output (it is still logged).")
def build(build_dir: Path | None, cuda_arch: str | None, tensorrt_root: Path | None, tensorrt_include: Path | None,
          jobs: int | None, build_type: str, warnings_as_errors: bool, quiet: bool) -> None:
    """Configure and build plugins/ with CMake; prints the built library paths."""
    from dsa_export.fileio import check_output_path

    archs = _parse_archs(cuda_arch)
    if build_dir is not None:
        check_output_path(build_dir, "--build-dir", folder=True, inside=True)
    src = lib.source_dir()
    if src is None:
        raise DSAUserError(
            "The plugin sources (plugins/CMakeLists.txt) are not part of this installation; "
            "build from a source checkout of dsa-export."
        )
    cmake = shutil.which("cmake")
    if cmake is None:
        raise DSAUserError("cmake was not found on PATH; install CMake >= 3.24 (e.g. `pip install cmake`) and run again.")
    if _cmake_version(cmake) < MIN_CMAKE:
        raise DSAUserError(f"{cmake} is older than CMake 3.24; install a newer CMake (e.g. `pip install cmake`).")
    nvcc = _find_nvcc()
    if nvcc is None:
        raise DSAUserError(
            "nvcc (the CUDA compiler) was not found; install the CUDA toolkit (12.x or 13.x) and put its bin/ "
            "on PATH or set CUDA_HOME."
        )
    cxx = _find_cxx()
    if cxx is None:
        raise DSAUserError("No C++ compiler was found (tried $CXX, c++, g++, clang++); install g++ and run again.")
    for opt, path in (("--tensorrt-root", tensorrt_root), ("--tensorrt-include", tensorrt_include)):
        if path is not None and not path.is_dir():
            raise DSAUserError(f"{opt} {path} is not a directory.")
    if tensorrt_include is not None and not (tensorrt_include / "NvInfer.h").is_file():
        raise DSAUserError(f"--tensorrt-include {tensorrt_include} holds no NvInfer.h; point it at TensorRT's include/.")

    out_dir = (build_dir or lib.default_build_dir()).expanduser().resolve()
    configure = [cmake, "-S", str(src), "-B", str(out_dir), f"-DCMAKE_BUILD_TYPE={build_type}",
                 f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCMAKE_CXX_COMPILER={cxx}",
                 f"-DDSA_WARNINGS_AS_ERRORS={'ON' if warnings_as_errors else 'OFF'}"]
    if archs:
        configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
    if tensorrt_root is not None:
        configure.append(f"-DTensorRT_ROOT={tensorrt_root.resolve()}")
    if tensorrt_include is not None:
        configure.append(f"-DTensorRT_INCLUDE_DIR={tensorrt_include.resolve()}")
    click.echo(f"[dsa-export] configuring {src} into {out_dir}", err=True)
    rc, tail = _run_streaming(configure, out_dir / "dsa_configure.log", quiet)
    if rc != 0:
        if quiet:
            click.echo("\n".join(tail), err=True)
        raise DSAUserError(f"CMake configure failed (exit {rc}); the full log is {out_dir / 'dsa_configure.log'}.")
    n_jobs = jobs or os.cpu_count() or 1
    click.echo(f"[dsa-export] building with {n_jobs} job(s); CUDA builds take minutes per architecture", err=True)
    rc, tail = _run_streaming([cmake, "--build", str(out_dir), "-j", str(n_jobs)], out_dir / "dsa_build.log", quiet)
    if rc != 0:
        if quiet:
            click.echo("\n".join(tail), err=True)
        raise DSAUserError(f"The plugin build failed (exit {rc}); the full log is {out_dir / 'dsa_build.log'}.")

    info_path = out_dir / lib.BUILD_INFO_NAME
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    built = info.get("libraries", {})
    for kind, name in built.items():
        click.echo(f"{kind}\t{out_dir / name}")
    archs_done = ";".join(info.get("cuda_architectures", []))
    if info.get("glue_built"):
        click.echo(f"[dsa-export] built kernels for sm {archs_done} and the TensorRT plugin library "
                   f"(TensorRT {info.get('tensorrt_version')} headers)", err=True)
    else:
        click.echo(f"[dsa-export] built kernels and the C ABI for sm {archs_done}; the TensorRT plugin glue was "
                   "SKIPPED because no TensorRT headers were found (pass --tensorrt-root or --tensorrt-include)",
                   err=True)
    if out_dir not in lib.search_dirs():
        click.echo(f"[dsa-export] note: {out_dir} is not searched by default; export "
                   f"{lib.ENV_VAR}={out_dir}", err=True)


@command.command(name="path")
@click.option("--kind", type=click.Choice(sorted(lib.LIBRARY_NAMES)), default="plugin", show_default=True,
              help="plugin: getCreators library; kernels: C ABI; static: load-time registration.")
@click.option("--json", "as_json", is_flag=True, help="Print hash, exported symbols and build info as JSON.")
def path_cmd(kind: str, as_json: bool) -> None:
    """Print the path of a built plugin library (exit 1 with build instructions if none)."""
    found = lib.require_library(kind)  # type: ignore[arg-type]
    if as_json:
        click.echo(json.dumps(lib.library_info(found).to_dict(), indent=2))
    else:
        click.echo(str(found))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(command())
