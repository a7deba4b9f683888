"""The build's output folder: the temporary sibling a build writes into, the file records of the
manifest, linking or copying external data beside the model, and the rename onto OUTDIR that makes
a build appear whole or not at all (see :mod:`dsa_export.artifact.builder`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsa_export import interrupts
from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.fileio import (
    atomic_output,
    check_output_path,
    file_record,
)
from dsa_export.manifest import (
    MANIFEST_NAME,
)


def file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file of the build (not manifest.json); a
    file whose digest the folder's cache holds (external data linked from a verified export) is
    not hashed again."""
    from dsa_export.integrity import known_digest

    records = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST_NAME and not path.name.startswith("."):
            relative = path.relative_to(folder).as_posix()
            digest = known_digest(folder, relative)
            records[relative] = {"size": path.stat().st_size, "sha256": digest} if digest else file_record(path)
    return records


def link_external_data(src: Path, work: Path, *, copy: bool = False) -> list[str]:
    """Put the external data files of ``src`` next to the build's copy, under the names the graph
    records: hard links when the folders share a filesystem (a stage's weights are not copied),
    else (or with ``copy``) copies. Digests known from the export's record go into the build
    folder's cache."""
    from dsa_export.integrity import confined, external_data_files, remember_hashes
    from dsa_export.stages.record import recorded_digests

    locations = external_data_files(src)
    digests = recorded_digests(src) if locations else {}
    known = {}
    for location in locations:
        source = confined(src.parent, location, f"the external data location '{location}' in '{src}'")
        if not source.is_file():
            raise DSAUserError(f"'{source}', the external data of '{src}', is missing; export the model again.")
        target = confined(work, location, f"the external data location '{location}' in '{src}'")
        target.parent.mkdir(parents=True, exist_ok=True)
        hard_linked = False
        if not copy:
            try:
                os.link(source, target)
                hard_linked = True
            except OSError:  # another filesystem, or links not allowed: copy
                pass
        if not hard_linked:
            with atomic_output(target) as tmp:
                shutil.copyfile(source, tmp)
        if source.resolve() in digests:
            known[Path(os.path.relpath(target, work)).as_posix()] = digests[source.resolve()]
    if known:
        remember_hashes(work, known)
    return locations


def check_library(path: Path) -> None:
    """``--plugins``: an existing shared library (ELF), refused before the first step."""
    if path.is_dir():
        raise DSAUsageError(f"--plugins '{path}' is a folder; pass the plugin library file (libdsa_plugins.so).")
    if not path.is_file():
        raise DSAUserError(f"--plugins {path} does not exist; pass the built libdsa_plugins.so.")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"\x7fELF":
        raise DSAUserError(f"--plugins {path} is not a shared library (no ELF header); pass the built libdsa_plugins.so.")




#: Hidden siblings a build writes next to OUTDIR (names carry the process id).
TEMPORARY_PREFIXES = ("build-", "old-")


def prepare_output(output: Path, force: bool, log: Callable[[str], None]) -> None:
    if output.exists() and not output.is_dir():
        raise DSAUsageError(f"-o '{output}' is a file; -o takes a folder to build into.")
    if output.is_dir() and any(output.iterdir()) and not (output / MANIFEST_NAME).is_file() and not force:
        raise DSAUserError(
            f"{output} exists, is not empty and holds no previous build; choose another -o or pass --force to replace it."
        )
    check_output_path(output, "-o", folder=True)
    prefixes = tuple(f".{output.name}.{p}" for p in TEMPORARY_PREFIXES)
    stale, busy = interrupts.stale_siblings(output.parent, prefixes)
    if busy:
        folder, pid = busy[0]
        raise DSAUserError(f"another build (process {pid}) is writing {output} right now ({folder.name}); wait for it "
                           "to finish or choose another -o.")
    for folder in stale:
        interrupts.remove(folder)
        log(f"Removed {folder}, left by an earlier build of {output} that was killed.")
    if output.parent.is_dir():
        for entry in output.parent.iterdir():  # dsa-export 0.1 named them without a process id
            if entry.name.startswith(prefixes) and entry.is_dir() and entry not in stale:
                log(f"Note: {entry} looks like the leftover of an interrupted build of {output}; remove it if no "
                    "build is running.")


def apply_umask(folder: Path) -> None:
    """Temporary files and folders are private (0600/0700); give the finished build the usual modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for path in folder.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def install(work: Path, output: Path) -> None:
    """Rename ``work`` onto ``output``, keeping the previous build until the new one is in place.
    An interrupt during the renames is raised after them, and the previous state is put back."""
    old: Path | None = None
    installed = False
    with contextlib.ExitStack() as stack:
        try:
            with interrupts.deferred():
                if output.exists():
                    old = Path(tempfile.mkdtemp(prefix=interrupts.tagged_name(f".{output.name}.old-"), dir=output.parent))
                    stack.enter_context(interrupts.temporary(old))
                    os.replace(output, old / "previous")
                os.replace(work, output)
                installed = True
        except BaseException:
            if installed:
                os.replace(output, work)  # removed by the caller
            if old is not None and (old / "previous").exists():
                os.replace(old / "previous", output)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
