"""Atomic file output: an artifact either appears whole or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, extra_suffixes: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds.

    ``extra_suffixes`` names companion files written next to the temporary path (for example
    ``".data"`` for ONNX external data) that are moved along with it. On any exception, including
    KeyboardInterrupt, every temporary file is removed and ``path`` is left untouched.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates 0600; give the artifact the mode any new file of the user's would get.
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        for suffix in extra_suffixes:
            companion = Path(str(tmp) + suffix)
            if companion.exists():
                os.replace(companion, Path(str(final) + suffix))
        os.replace(tmp, final)
    except BaseException:
        for candidate in [tmp, *(Path(str(tmp) + s) for s in extra_suffixes)]:
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
