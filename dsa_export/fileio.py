"""Files the user asked for: checked before any work, written atomically, hashed.

:func:`check_output_path` refuses an output path that cannot be written (a folder where a file is
wanted, a parent that is a file, a read-only or full place, a name too long) before minutes of
work; :func:`atomic_output` makes an artifact appear whole or not at all, and turns a file-system
failure while writing (a full disk) into a user error naming the file. Temporary names carry the
process id (:func:`dsa_export.interrupts.tagged_name`), so the temporaries of a killed process are
recognised and removed by the next write to the same path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dsa_export import interrupts
from dsa_export.errors import DSAUsageError, DSAUserError, as_user_error

#: Longest file name most file systems accept (bytes).
NAME_MAX = 255


def check_output_path(path: str | os.PathLike[str], option: str, *, folder: bool = False,
                      inside: bool = False) -> Path:
    """Refuse ``path`` as an output of ``option`` (e.g. ``-o``) unless it can be written.

    ``folder``: the output is a folder (else a file). ``inside``: files are written inside that
    folder (else the output is created next to its siblings and renamed into place). Nothing is
    left behind: the write test creates and removes one hidden file.
    """
    path = Path(path)
    label = f"{option} '{path}'"
    if str(path) in ("", "."):
        pass
    elif path.is_dir() and not folder:
        raise DSAUsageError(f"{label} is a folder; pass the file to write.")
    elif path.exists() and folder and not path.is_dir():
        raise DSAUsageError(f"{label} is a file; pass a folder.")
    for part in path.parts:
        if len(part.encode(errors="surrogateescape")) > NAME_MAX:
            raise DSAUserError(f"{label} has a name longer than {NAME_MAX} bytes; use a shorter name.")
    start = path if (inside and path.is_dir()) else path.parent
    ancestor = start
    while not ancestor.exists():
        if ancestor.parent == ancestor:
            break
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise DSAUserError(f"{label} cannot be created: '{ancestor}' is a file, not a folder; choose another path.")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dsa-export-write-test-", dir=ancestor)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise DSAUserError(f"{label} cannot be written ({reason} in '{ancestor}'); choose a path you may write to.") \
            from exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return path


def make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns the folders created (innermost first), so a
    failure can remove them again with :func:`remove_created`."""
    missing = []
    current = folder
    while not current.exists() and current.parent != current:
        missing.append(current)
        current = current.parent
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def remove_created(folders: list[Path]) -> None:
    """Remove folders :func:`make_parents` created, as long as they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def remove_stale_temporaries(final: Path) -> None:
    """Remove hidden temporaries of ``final`` left by processes that no longer run."""
    stale, _busy = interrupts.stale_siblings(final.parent, (f".{final.name}.",))
    for entry in stale:
        interrupts.remove(entry)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, extra_suffixes: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds.

    ``extra_suffixes`` names companion files written next to the temporary path (for example
    ``".data"`` for ONNX external data) that are moved along with it. On any exception, including
    KeyboardInterrupt, every temporary file is removed and ``path`` is left untouched. A
    file-system failure (a full disk, a read-only folder) becomes a :class:`DSAUserError`.
    """
    final = Path(path)
    created: list[Path] = []
    try:
        created = make_parents(final.parent)
        remove_stale_temporaries(final)
        fd, tmp_name = tempfile.mkstemp(prefix=interrupts.tagged_name(f".{final.name}."), suffix=".tmp",
                                        dir=final.parent)
    except OSError as exc:
        remove_created(created)
        _raise_write_error(exc, final)
    os.close(fd)
    tmp = Path(tmp_name)
    companions = [Path(str(tmp) + s) for s in extra_suffixes]
    with contextlib.ExitStack() as registered:
        for candidate in [tmp, *companions]:
            registered.enter_context(interrupts.temporary(candidate))
        try:
            # mkstemp creates 0600; give the artifact the mode any new file of the user's would get.
            os.chmod(tmp, 0o666 & ~_umask())
            yield tmp
            with interrupts.deferred():
                for suffix, companion in zip(extra_suffixes, companions):
                    if companion.exists():
                        os.replace(companion, Path(str(final) + suffix))
                os.replace(tmp, final)
        except BaseException as exc:
            for candidate in [tmp, *companions]:
                with contextlib.suppress(FileNotFoundError, OSError):
                    candidate.unlink()
            remove_created(created)
            if isinstance(exc, OSError):
                _raise_write_error(exc, final)
            raise


def _raise_write_error(exc: OSError, final: Path) -> None:
    mapped = as_user_error(exc, f"writing '{final}'")
    if mapped is None:
        raise exc
    raise mapped from exc


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


def file_record(path: str | os.PathLike[str]) -> dict[str, int | str]:
    """``{"size": bytes, "sha256": hex}`` of a file, as manifests record it."""
    return {"size": os.stat(path).st_size, "sha256": sha256_file(path)}
