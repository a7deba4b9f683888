"""Find the built DSA plugin libraries and describe them (hash, exported symbols, CUDA archs).

Search order for :func:`find_library`:

1. ``$DSA_EXPORT_PLUGIN_LIB``: a library file (used for every kind whose file name matches, or for
   any kind when the name is not one of ours) or a directory to search;
2. the in-tree build directory ``plugins/build`` of a source checkout;
3. the user cache ``$XDG_CACHE_HOME/dsa-export/plugins`` (``~/.cache/dsa-export/plugins``), where
   ``dsa-export plugins build`` puts the libraries when there is no source checkout to build into.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dsa_export.errors import DSAUserError
from dsa_export.fileio import sha256_file

LibraryKind = Literal["plugin", "kernels", "static"]

log = logging.getLogger(__name__)

#: File name of each library kind, as the CMake project writes them.
LIBRARY_NAMES: dict[str, str] = {
    "plugin": "libdsa_plugins.so",
    "kernels": "libdsa_kernels.so",
    "static": "libdsa_plugins_static.so",
}

#: The sidecar the CMake build writes next to the libraries.
BUILD_INFO_NAME = "dsa_build_info.json"

ENV_VAR = "DSA_EXPORT_PLUGIN_LIB"

#: Symbols each kind must export to be usable.
REQUIRED_SYMBOLS: dict[str, tuple[str, ...]] = {
    "plugin": ("getCreators", "setLoggerFinder"),
    "kernels": ("dsa_indexer_topk", "dsa_sparse_attention", "dsa_moe_experts", "dsa_kernels_abi_version"),
    "static": (),
}


def source_dir() -> Path | None:
    """The ``plugins/`` CMake project of a source checkout, or None for an installed wheel."""
    candidate = Path(__file__).resolve().parents[2] / "plugins"
    return candidate if (candidate / "CMakeLists.txt").is_file() else None


def cache_dir() -> Path:
    """Per-user build directory used when there is no source checkout to build into."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsa-export" / "plugins"


def default_build_dir() -> Path:
    """Where ``dsa-export plugins build`` builds by default: ``plugins/build`` in a checkout, else the cache."""
    src = source_dir()
    return src / "build" if src is not None else cache_dir()


def search_dirs() -> list[Path]:
    """Directories searched for the libraries, in order (the environment variable comes first)."""
    dirs: list[Path] = []
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        dirs.append(path if path.is_dir() else path.parent)
    src = source_dir()
    if src is not None:
        dirs.append(src / "build")
    dirs.append(cache_dir())
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _check_kind(kind: str) -> None:
    if kind not in LIBRARY_NAMES:
        raise ValueError(f"unknown plugin library kind {kind!r}; expected one of {sorted(LIBRARY_NAMES)}")


def find_library(kind: LibraryKind = "plugin") -> Path | None:
    """Path of the built library of this kind, or None when none is found.

    ``$DSA_EXPORT_PLUGIN_LIB`` naming a file wins for the kind whose file name it has (and for
    ``plugin`` when the name is not one of ours, so users can point at a renamed plugin library).
    """
    _check_kind(kind)
    name = LIBRARY_NAMES[kind]
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if path.is_file() and (path.name == name or (kind == "plugin" and path.name not in LIBRARY_NAMES.values())):
            return path.resolve()
    for directory in search_dirs():
        for candidate in (directory / name, directory / "lib" / name):
            if candidate.is_file():
                return candidate.resolve()
    return None


def build_hint() -> str:
    """One sentence telling the user how to get the libraries."""
    return (
        "build them with `dsa-export plugins build` (needs the CUDA toolkit and cmake; add "
        "--tensorrt-root DIR for the TensorRT plugin library) or point $DSA_EXPORT_PLUGIN_LIB at a built library"
    )


def require_library(kind: LibraryKind = "plugin") -> Path:
    """Like :func:`find_library` but raises a :class:`DSAUserError` saying how to build it."""
    path = find_library(kind)
    if path is None:
        searched = ", ".join(str(d) for d in search_dirs())
        raise DSAUserError(f"No {LIBRARY_NAMES[kind]} was found in {searched}; {build_hint()}.")
    return path


@dataclass(frozen=True)
class LibraryInfo:
    """What a built library is: for manifests and for ``dsa-export check``."""

    path: Path
    kind: str | None
    sha256: str
    size_bytes: int
    exported_symbols: tuple[str, ...]
    missing_symbols: tuple[str, ...]
    build_info: dict = field(default_factory=dict)

    @property
    def cuda_architectures(self) -> list[str]:
        return list(self.build_info.get("cuda_architectures", []))

    @property
    def tensorrt_version(self) -> str | None:
        return self.build_info.get("tensorrt_version") or None

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "exported_symbols": list(self.exported_symbols),
            "missing_symbols": list(self.missing_symbols),
            "cuda_architectures": self.cuda_architectures,
            "tensorrt_version": self.tensorrt_version,
            "build_info": self.build_info,
        }


def exported_symbols(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Defined dynamic symbols of a shared library (``nm -D --defined-only``, or a pure-Python ELF read)."""
    try:
        out = subprocess.run(
            ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        names = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] in {"T", "W", "D", "B", "R", "i", "u", "V"}:
                names.append(parts[2].split("@")[0])
        return tuple(sorted(set(names)))
    except (OSError, subprocess.SubprocessError):
        return _elf_dynamic_symbols(Path(path))


def _elf_dynamic_symbols(path: Path) -> tuple[str, ...]:
    """Minimal ELF64 little-endian reader of .dynsym for machines without binutils."""
    import struct

    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return ()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        strtab = sections[sh[6]]
        str_off = strtab[4]
        for off in range(sh[4], sh[4] + sh[5], sh[9] or 24):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, off)
            if st_shndx == 0 or st_name == 0 or (st_info >> 4) not in (1, 2):  # undefined or local
                continue
            end = data.index(b"\0", str_off + st_name)
            names.add(data[str_off + st_name : end].decode())
    return tuple(sorted(names))


def _kind_of(path: Path) -> str | None:
    for kind, name in LIBRARY_NAMES.items():
        if path.name == name:
            return kind
    return None


def library_info(path: str | os.PathLike[str]) -> LibraryInfo:
    """Hash, exported symbols and build sidecar (CUDA archs, TensorRT version) of a built library."""
    lib = Path(path)
    if not lib.is_file():
        raise DSAUserError(f"Plugin library {lib} does not exist; {build_hint()}.")
    kind = _kind_of(lib)
    symbols = exported_symbols(lib)
    missing = tuple(s for s in REQUIRED_SYMBOLS.get(kind or "", ()) if s not in symbols)
    build_info: dict = {}
    sidecar = lib.parent / BUILD_INFO_NAME
    if sidecar.is_file():
        try:
            build_info = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            build_info = {}
    return LibraryInfo(
        path=lib.resolve(),
        kind=kind,
        sha256=sha256_file(lib),
        size_bytes=lib.stat().st_size,
        exported_symbols=symbols,
        missing_symbols=missing,
        build_info=build_info,
    )


#: Plugin libraries this process registered: (id of the TensorRT module, resolved path) -> (module,
#: handle). The module is kept so that its id stays its own; the handle is None when the creators
#: were already registered by a load that was not ours.
_LOADED: dict[tuple[int, str], tuple[object, object]] = {}


def registered_creators(registry) -> list[str]:
    """Our op names whose plugin creator (version 1, namespace ``dsa``) ``registry`` already holds."""
    from dsa_export.ops.contract import PLUGIN_NAMESPACE, PLUGIN_OPS, PLUGIN_VERSION

    found = []
    for name in PLUGIN_OPS:
        try:
            creator = registry.get_creator(name, PLUGIN_VERSION, PLUGIN_NAMESPACE)
        except Exception:  # a binding without get_creator, or one that raises for an unknown name
            creator = None
        if creator is not None:
            found.append(name)
    return found


def load_plugin_library(trt_module, path: str | os.PathLike[str]) -> Path:
    """Register the creators of plugin library ``path`` with ``trt_module``'s plugin registry, once per process.

    ``IPluginRegistry.load_library`` returns null when any of the library's creators is already
    registered, so a second build or engine load in the same process (the stages of a pipeline)
    would fail; a library loaded before is therefore not loaded again. When the call fails for a
    library we have not loaded but our creators are registered (another part of the process
    loaded it), those creators are used. Otherwise the library could not be loaded: a user error.
    """
    resolved = Path(path).resolve()
    key = (id(trt_module), str(resolved))
    if key in _LOADED:
        return resolved
    registry = trt_module.get_plugin_registry()
    handle = registry.load_library(str(resolved))
    if handle is None:
        already = registered_creators(registry)
        if not already:
            raise DSAUserError(
                f"TensorRT could not load the plugin library {resolved}; check that it was built against this "
                "TensorRT version (`dsa-export plugins path --json` shows the headers it used)."
            )
        log.warning("TensorRT did not load %s because the creators of %s are already registered in this process; "
                    "using those.", resolved, ", ".join(already))
    _LOADED[key] = (trt_module, handle)
    return resolved


def load_into_tensorrt(trt_module=None, kind: LibraryKind = "plugin") -> Path:
    """Register the DSA plugin creators with TensorRT's global plugin registry; returns the library path.

    ``kind="plugin"`` goes through ``IPluginRegistry.load_library`` (``getCreators``), once per
    process (:func:`load_plugin_library`); ``"static"`` is only ``dlopen``-ed, its creators register
    themselves. ``trt_module`` defaults to ``import tensorrt`` (imported here, never at package import).
    """
    path = require_library(kind)
    if trt_module is None:
        from dsa_export.errors import require

        trt_module = require("tensorrt", "Loading the DSA TensorRT plugins")
    if kind == "static":
        import ctypes

        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        return path
    return load_plugin_library(trt_module, path)
