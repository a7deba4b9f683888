"""Exception types that separate a user's mistake from a bug in dsa-export.

A :class:`DSAUserError` is something the user can fix (a missing file, a bad shape, an
unsupported option); the CLI prints its one-sentence message and exits 1 without a traceback.
Anything else that escapes is a bug and is reported as one.
"""

from __future__ import annotations


class DSAUserError(Exception):
    """Something the user can fix. The message says what is wrong and what to do."""


class DSAUsageError(DSAUserError):
    """The command line itself is wrong (exit code 2)."""


class MissingDependencyError(DSAUserError):
    """An optional package needed for this feature is not installed."""

    def __init__(self, package: str, feature: str, install: str | None = None):
        hint = install or f"pip install {package}"
        super().__init__(f"{feature} needs the '{package}' package, which is not installed; run `{hint}`.")
        self.package = package


def require(module: str, feature: str, install: str | None = None):
    """Import ``module`` or raise a :class:`MissingDependencyError` naming the install command."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(module.split(".")[0], feature, install) from exc
