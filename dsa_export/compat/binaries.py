"""Read what a shared library was built against without loading it.

Loading a plugin library to ask it questions can itself fail with the very "undefined symbol" error we
want to explain, so we read the ELF dynamic section (DT_NEEDED) and the CUDA fat binary headers
directly.
"""

from __future__ import annotations

import struct
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
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        section_fmt, dyn_fmt = "<IIQQQQIIQQ", "<qQ"
    else:
        (shoff,) = struct.unpack_from("<I", data, 0x20)
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


_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_FATBIN_KIND_PTX = 1
_FATBIN_KIND_SASS = 2


def cuda_architectures(path: str | Path) -> dict[str, list[str]]:
    """Compute capabilities of the SASS and PTX embedded in ``path``'s CUDA fat binaries.

    Reads the fatbin container headers directly (magic 0xBA55ED50; per entry: kind 1 = PTX, 2 = SASS
    at offset 0, header size at 4, payload size at 8, SM number at 28), so no CUDA tool is needed.
    Entry headers stay uncompressed even when the payload is compressed.
    """
    data = Path(path).read_bytes()
    sass: set[int] = set()
    ptx: set[int] = set()
    start = data.find(_FATBIN_MAGIC)
    while start != -1:
        try:
            header_size, fat_size = struct.unpack_from("<HQ", data, start + 6)
            entry = start + header_size
            end = min(entry + fat_size, len(data))
            while entry + 32 <= end:
                kind, entry_header_size, payload_size = struct.unpack_from("<HxxIQ", data, entry)
                (arch,) = struct.unpack_from("<I", data, entry + 28)
                if entry_header_size == 0:
                    break
                if kind == _FATBIN_KIND_SASS:
                    sass.add(arch)
                elif kind == _FATBIN_KIND_PTX:
                    ptx.add(arch)
                entry += entry_header_size + payload_size
        except struct.error:  # a truncated container at the end of the file
            pass
        start = data.find(_FATBIN_MAGIC, start + 4)
    return {
        "sass": [_sm_to_cc(a) for a in sorted(sass)],
        "ptx": [_sm_to_cc(a) for a in sorted(ptx)],
    }


def _sm_to_cc(sm: int) -> str:
    """``90`` -> ``"9.0"``, ``120`` -> ``"12.0"``."""
    return f"{sm // 10}.{sm % 10}"
