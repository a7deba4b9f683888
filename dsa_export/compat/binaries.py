"""Read what a shared library was built against without loading it.

Loading a plugin library to ask it questions can itself fail with the very "undefined symbol" error we
want to explain, so we read the ELF dynamic section (DT_NEEDED) directly and ask ``cuobjdump`` which
GPU architectures its device code covers.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

_ELF_MAGIC = b"\x7fELF"
_DT_NEEDED = 1
_DT_STRTAB = 5
_SHT_DYNAMIC = 6


def elf_needed_libraries(path: str | Path) -> list[str]:
    """Sonames an ELF shared library depends on (its DT_NEEDED entries), in file order.

    Raises ValueError when the file is not a 64- or 32-bit little-endian ELF file.
    """
    data = Path(path).read_bytes()
    if data[:4] != _ELF_MAGIC:
        raise ValueError(f"{path} is not an ELF file")
    is_64 = data[4] == 2
    if data[5] != 1:
        raise ValueError(f"{path} is not little-endian")
    if is_64:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        section_fmt, dyn_fmt = "<IIQQQQIIQQ", "<qQ"
    else:
        shoff, = struct.unpack_from("<I", data, 0x20)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x2E)
        section_fmt, dyn_fmt = "<IIIIIIIIII", "<iI"
    sections = [struct.unpack_from(section_fmt, data, shoff + i * shentsize) for i in range(shnum)]
    needed: list[str] = []
    for section in sections:
        if section[1] != _SHT_DYNAMIC:
            continue
        offset, size, link = section[4], section[5], section[6]
        strtab_offset = sections[link][4]
        entry_size = struct.calcsize(dyn_fmt)
        for start in range(offset, offset + size, entry_size):
            tag, value = struct.unpack_from(dyn_fmt, data, start)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                end = data.index(b"\x00", strtab_offset + value)
                needed.append(data[strtab_offset + value : end].decode("utf-8", "replace"))
    return needed


_SM_PATTERN = re.compile(r"\bsm_(\d+)([a-z]?)\b")
_PTX_PATTERN = re.compile(r"\bcompute_(\d+)([a-z]?)\b")


def cuda_architectures(path: str | Path, timeout_s: float = 5.0) -> dict[str, list[str]] | None:
    """SASS and PTX architectures embedded in ``path`` according to ``cuobjdump``; None without cuobjdump."""
    tool = shutil.which("cuobjdump") or _cuda_home_tool("cuobjdump")
    if tool is None:
        return None
    sass: set[str] = set()
    ptx: set[str] = set()
    for flag, pattern, into in (("--list-elf", _SM_PATTERN, sass), ("--list-ptx", _PTX_PATTERN, ptx)):
        result = subprocess.run(
            [tool, flag, str(path)], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        for major_minor, suffix in pattern.findall(result.stdout):
            into.add(_sm_to_cc(major_minor) + suffix)
    return {"sass": sorted(sass, key=_cc_key), "ptx": sorted(ptx, key=_cc_key)}


def _sm_to_cc(digits: str) -> str:
    """``"90"`` -> ``"9.0"``, ``"120"`` -> ``"12.0"``."""
    return f"{digits[:-1]}.{digits[-1]}"


def _cc_key(cc: str) -> tuple[int, int]:
    major, minor = cc.rstrip("abcdefghijklmnopqrstuvwxyz").split(".")
    return int(major), int(minor)


def _cuda_home_tool(name: str) -> str | None:
    import os

    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / name).is_file():
            return str(Path(home) / "bin" / name)
    return None
