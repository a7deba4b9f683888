"""Build libdsa_kernels_emu.so: the kernel sources of plugins/ (the same list CMake compiles into
libdsa_kernels.so, read from plugins/CMakeLists.txt) rewritten by preprocess.py and compiled by the
host compiler against cuda_emu.h, linked with the emulator. Builds are cached by the hash of every
input, so a test session compiles once; a mutation (an injected bug) is a list of source patches.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import preprocess

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PLUGINS = REPO / "plugins"
EMU_SOURCES = (HERE / "cuda_emu.h", HERE / "emu_runtime.cpp", HERE / "preprocess.py", Path(__file__).resolve())
CXXFLAGS = ("-std=c++17", "-O2", "-fPIC", "-g0", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function",
            "-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Wno-class-memaccess", "-fno-strict-aliasing")


class BuildError(RuntimeError):
    """The emulation build failed; the message holds the compiler's output."""


@dataclass(frozen=True)
class Patch:
    """Replace ``old`` (which must occur exactly ``count`` times) by ``new`` in ``path`` (relative to plugins/)."""

    path: str
    old: str
    new: str
    count: int = 1


def cuda_include() -> Path:
    """The CUDA toolkit's include folder (headers only: nothing of the CUDA runtime is linked)."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parents[1] / "include")
    candidates += [Path("/usr/local/cuda/include")]
    for c in candidates:
        if (c / "cuda_runtime.h").is_file() and (c / "cuda_bf16.h").is_file():
            return c
    raise BuildError("the CUDA toolkit headers (cuda_runtime.h, cuda_bf16.h) were not found; install the CUDA "
                     "toolkit or set CUDA_HOME")


def kernel_sources() -> list[str]:
    """Sources of the kernel library, as plugins/CMakeLists.txt lists them (target dsa_kernels_obj)."""
    text = (PLUGINS / "CMakeLists.txt").read_text()
    m = re.search(r"add_library\(dsa_kernels_obj\s+OBJECT\s+(.*?)\)", text, re.S)
    if m is None:
        raise BuildError("plugins/CMakeLists.txt has no dsa_kernels_obj target")
    return m.group(1).split()


def _tree_files() -> list[Path]:
    return sorted(p for p in PLUGINS.rglob("*") if p.suffix in {".h", ".cuh", ".cu", ".cpp"} and p.is_file())


def _sha(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:24]


def cache_root() -> Path:
    return Path(os.environ.get("DSA_EMU_CACHE", Path(tempfile.gettempdir()) / "dsa-export-emu"))


def _sources(patches: tuple[Patch, ...]) -> dict[str, str]:
    """Every file of plugins/ (relative path -> text) with the patches applied and CUDA rewritten."""
    texts: dict[str, str] = {}
    applied: set[int] = set()
    for path in _tree_files():
        rel = path.relative_to(PLUGINS).as_posix()
        text = path.read_text()
        for i, patch in enumerate(patches):
            if patch.path == rel:
                n = text.count(patch.old)
                if n != patch.count:
                    raise BuildError(f"patch for {rel}: expected {patch.count} occurrence(s) of {patch.old!r}, found {n}")
                text = text.replace(patch.old, patch.new)
                applied.add(i)
        if path.suffix in {".cu", ".cuh"}:
            text = preprocess.rewrite(text, rel)
        texts[rel] = text
    missing = [p.path for i, p in enumerate(patches) if i not in applied]
    if missing:
        raise BuildError(f"patches name files that do not exist: {sorted(missing)}")
    return texts


def _compile(cmd: list[str], obj: Path) -> None:
    tmp = obj.with_name(obj.name + f".{os.getpid()}.tmp")
    proc = subprocess.run([*cmd, "-o", str(tmp)], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"compiling {cmd[-1]} failed:\n{proc.stderr[-6000:]}")
    if proc.stderr.strip():
        tmp.unlink(missing_ok=True)
        raise BuildError(f"compiling {cmd[-1]} gave warnings (the emulation build takes none):\n{proc.stderr[-6000:]}")
    os.replace(tmp, obj)


def build_library(patches: tuple[Patch, ...] = (), *, jobs: int | None = None) -> Path:
    """Path of the emulation library for the current sources (plus ``patches``), built if needed.

    Objects are cached by the hash of their rewritten source, every header and the flags, so a
    mutant recompiles only the file its patch touches.
    """
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise BuildError("no host C++ compiler (g++) on PATH")
    inc = cuda_include()
    texts = _sources(patches)
    headers = _sha(*(f"{rel}\n{text}" for rel, text in sorted(texts.items()) if not rel.endswith((".cu", ".cpp"))))
    emu_hash = _sha(*(p.read_bytes() for p in EMU_SOURCES))
    flags = repr(CXXFLAGS) + cxx + str(inc)
    root = cache_root()
    obj_dir = root / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)
    units: list[tuple[str, Path]] = []
    for rel in kernel_sources():
        if rel not in texts:
            raise BuildError(f"plugins/CMakeLists.txt lists {rel}, which does not exist")
        units.append((rel, obj_dir / f"{_sha(rel, texts[rel], headers, emu_hash, flags)}.o"))
    runtime_obj = obj_dir / f"emu_runtime-{_sha(emu_hash, flags)}.o"
    lib_dir = root / _sha(*(str(o) for _, o in units), str(runtime_obj))
    lib = lib_dir / "libdsa_kernels_emu.so"
    if lib.is_file():
        return lib
    work = Path(tempfile.mkdtemp(prefix="emu-src-", dir=root))
    try:
        for rel, text in texts.items():
            dest = work / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
        jobs_list = []
        for rel, obj in units:
            if obj.is_file():
                continue
            cmd = [cxx, *CXXFLAGS, "-I", str(work), "-isystem", str(inc), "-I", str(HERE)]
            if rel.endswith(".cu"):
                cmd += ["-include", str(HERE / "cuda_emu.h"), "-x", "c++"]
            jobs_list.append(([*cmd, "-c", str(work / rel)], obj))
        if not runtime_obj.is_file():
            jobs_list.append(([cxx, *CXXFLAGS, "-isystem", str(inc), "-I", str(HERE), "-c",
                               str(HERE / "emu_runtime.cpp")], runtime_obj))
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
            list(pool.map(lambda job: _compile(*job), jobs_list))
        lib_dir.mkdir(parents=True, exist_ok=True)
        tmp_lib = lib_dir / f"libdsa_kernels_emu.so.{os.getpid()}.tmp"
        objs = [str(o) for _, o in units] + [str(runtime_obj)]
        proc = subprocess.run([cxx, "-shared", "-o", str(tmp_lib), *objs], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"linking the emulation library failed:\n{proc.stderr[-6000:]}")
        os.replace(tmp_lib, lib)
        return lib
    finally:
        shutil.rmtree(work, ignore_errors=True)
