"""One interface over the runtimes: :class:`Session` (``dsa_export.runtime.load(artifact)`` opens one).

A session takes numpy inputs by name and returns numpy outputs by name, whatever runs underneath
(ONNX Runtime on CPU/CUDA/TensorRT execution providers, a TensorRT or TensorRT-RTX engine).
Loading an engine runs the engine gate first (:func:`dsa_export.compat.gate_engine`), so a
mismatched TensorRT, GPU or plugin library is refused with its reason before deserialization.
Every file a session loads from a build folder is checked against the sizes and sha256 in its
``manifest.json`` first (``verify=False`` skips that, for users who insist), and every run checks
its inputs' names, shapes (against the build's profile), dtypes and token-id range before running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsa_export.errors import DSAUsageError, DSAUserError, as_user_error
from dsa_export.manifest import (
    Manifest,
    TensorSpec,
    check_feeds,
    make_inputs,
)

RUNTIME_CHOICES = ("auto", "engine", "onnxruntime")


@dataclass
class Session:
    """Base of the runtime sessions. Subclasses implement :meth:`_run`."""

    kind: str  # e.g. "onnxruntime (cpu)", "tensorrt-rtx 1.7.1"
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    manifest: Manifest | None = None
    notes: list[str] = field(default_factory=list)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check the feeds against the inputs (names, ranks, profile, dtypes, token-id range,
        memory) and run; what the runtime then refuses about the inputs is a user error too."""
        shapes = {name: tuple(np.shape(value)) for name, value in feeds.items()}
        return self._guarded(self._run, self._checked_feeds(feeds, shapes))

    def _checked_feeds(self, host: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        """``host`` checked (names, profile, dtypes, token-id range) and the memory a run of
        ``shapes`` (every input's shape, device-resident ones included) needs; returns ``host``
        as the runtime takes it."""
        names = [spec.name for spec in self.inputs]
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise DSAUserError(f"unknown input(s) {unknown}; this model takes {', '.join(names)}.")
        self.check_shapes(shapes)
        host = check_feeds([spec for spec in self.inputs if spec.name in host], host, "the model")
        self.check_memory(shapes)
        return host

    @staticmethod
    def _guarded(run, *args):
        """``run(*args)``, with what the runtime refuses about the inputs as a user error."""
        try:
            return run(*args)
        except DSAUserError:
            raise
        except Exception as exc:
            mapped = as_user_error(exc, "running the model on these inputs")
            if mapped is None:
                raise
            raise mapped from exc

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        from dsa_export.manifest import check_shapes

        check_shapes(self.inputs, {}, shapes, self.kind)

    def check_memory(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Refuse shapes whose run cannot fit in this machine's memory (CPU runtimes only)."""

    def sequence_limit(self) -> int | None:
        """The most tokens one sequence may hold (prompt and generated), as the build's profiles
        allow (``total_sequence``; a paged graph: ``max_pages`` pages per row); None when nothing
        bounds it (an .onnx on ONNX Runtime)."""
        if self.manifest is None:
            return None
        limits = [dims["total_sequence"][2] for dims in self.manifest.profile_sets if "total_sequence" in dims]
        if any("max_pages" in dims for dims in self.manifest.profile_sets):
            from dsa_export.runtime.paged import page_size

            page = page_size(self.inputs)
            limits += [dims["max_pages"][2] * page for dims in self.manifest.profile_sets if "max_pages" in dims]
        return max(limits) if limits else None

    def dim_limit(self, name: str) -> int | None:
        """The largest value of dim ``name`` any profile of the build allows (``batch``: rows per
        call, ``sequence``: tokens per row and call); None when nothing bounds it."""
        if self.manifest is None:
            return None
        limits = [dims[name][2] for dims in self.manifest.profile_sets if name in dims]
        return max(limits) if limits else None

    def dim_names(self) -> set[str]:
        """The named dynamic dims of the inputs (what ``--dims`` may set)."""
        return {d for spec in self.inputs for d in spec.shape if isinstance(d, str)}

    def example_inputs(self, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        """Random inputs at the profile's opt shape (or ``dims``), as the manifest describes them."""
        unknown = sorted(set(dims or {}) - self.dim_names())
        if unknown:
            known = ", ".join(sorted(self.dim_names())) or "none"
            raise DSAUsageError(f"--dims names {', '.join(unknown)}, which no input of this model has (its dims: "
                                f"{known}).")
        sizes = dict(self.manifest.opt_dims()) if self.manifest is not None else {}
        sizes.update(dims or {})
        return make_inputs(self.inputs, sizes, seed, before=self.check_memory)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass


__all__ = ["RUNTIME_CHOICES", "Session"]
