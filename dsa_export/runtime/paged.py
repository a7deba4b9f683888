"""Paged decode caches: the page allocator of a pipeline and the pools a stage keeps.

A paged graph (``export --graph paged``, :mod:`dsa_export.hf.model`) takes per layer a latent pool
``past_latent_pool_i [pages, page, 576]`` (and an index-key pool), returns the same pools with the
call's tokens written (``present_*``), and reads each row's tokens through ``block_table [B, M]``.

* :class:`PageAllocator` (one per pipeline) hands pages to sequences: page ``j`` of a sequence
  holds its logical positions ``j*page .. j*page+page-1``. Page 0 is the graph's scratch page
  (padding tokens are written there) and is never handed out. Every stage uses the same page ids,
  so one block table serves the whole pipeline.
* :class:`StagePools` (one per stage) holds that stage's pools, allocated once and grown
  geometrically when a block table names a page past their end. On ONNX Runtime's CPU provider the
  pools are OrtValues bound as the ``past`` input **and** the ``present`` output of the same call
  (IO binding): ScatterND then writes only the new tokens' rows (docs/cache_update.md). A TensorRT
  engine whose pools are written in place (the DSAPagedCacheWrite plugin, which the engine reports
  through ``get_aliased_input_tensor``) gets each pool's device buffer as input and output alike.
  Other runtimes return the written pools as new buffers, which replace the old ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dsa_export.errors import DSAUserError

PAST, PRESENT = "past_", "present_"
#: Inputs that mark a paged graph and say where each row's tokens go.
CONTROLS = ("query_start", "query_lengths", "block_table")


def is_paged(names) -> bool:
    """Whether a model with these input names is a paged graph."""
    return "block_table" in set(names)


def pool_inputs(specs) -> list:
    """The pool inputs among ``specs`` (TensorSpecs of a paged graph)."""
    return [spec for spec in specs if spec.name.startswith(PAST) and "_pool_" in spec.name]


def page_size(specs) -> int:
    """Tokens per page of a paged graph (the static second dimension of its pools)."""
    sizes = {spec.shape[1] for spec in pool_inputs(specs)}
    if len(sizes) != 1 or not all(isinstance(size, int) and size > 0 for size in sizes):
        raise DSAUserError(f"the cache pools of this paged graph disagree on their page size ({sorted(map(str, sizes))}); "
                           "export it again with --graph paged.")
    return sizes.pop()


class PageAllocator:
    """Pages for sequences of a paged pipeline; ``limit`` caps the pages a pool may hold (page 0,
    the scratch page, included; None: no cap)."""

    def __init__(self, page: int, limit: int | None = None):
        self.page = page
        self.limit = limit
        self.tables: dict[Any, list[int]] = {}
        self._free: list[int] = []  # handed back, reused lowest first
        self._next = 1  # page 0 is scratch

    @property
    def pages_in_use(self) -> int:
        return sum(len(pages) for pages in self.tables.values())

    @property
    def pages_touched(self) -> int:
        """Pages ever handed out, scratch page included: what the pools had to grow to."""
        return self._next

    def _take(self) -> int:
        if self._free:
            self._free.sort(reverse=True)
            return self._free.pop()
        if self.limit is not None and self._next >= self.limit:
            raise DSAUserError(f"the cache pools hold {self.limit} pages of {self.page} tokens and all are in use; "
                               "run fewer or shorter sequences at once, or give the caches more pages.")
        self._next += 1
        return self._next - 1

    def ensure(self, sequence: Any, tokens: int) -> None:
        """Give ``sequence`` the pages for its first ``tokens`` logical positions."""
        pages = self.tables.setdefault(sequence, [])
        while len(pages) * self.page < tokens:
            pages.append(self._take())

    def release(self, sequence: Any) -> None:
        """Hand the pages of ``sequence`` back."""
        self._free.extend(self.tables.pop(sequence, []))

    def table(self, sequences: list[Any], width: int | None = None) -> np.ndarray:
        """``block_table [len(sequences), width]`` int32, -1 after each sequence's pages."""
        width = max([len(self.tables.get(s, [])) for s in sequences] + [width or 1])
        table = np.full((len(sequences), width), -1, dtype=np.int32)
        for row, sequence in enumerate(sequences):
            pages = self.tables.get(sequence, [])
            table[row, : len(pages)] = pages
        return table


def pages_limit(session) -> int | None:
    """The most pages a pool of ``session`` may hold: the ``pages`` maximum of its build's
    profiles (None for an .onnx on ONNX Runtime, which takes any size)."""
    manifest = getattr(session, "manifest", None)
    limits = [dims["pages"][2] for dims in (manifest.profile_sets if manifest is not None else []) if "pages" in dims]
    return min(limits) if limits else None


class StagePools:
    """The cache pools of one stage of a paged graph (see the module docstring)."""

    def __init__(self, session, specs):
        self.session = session
        self.specs = {spec.name: spec for spec in specs}
        self.limit = pages_limit(session)
        self.pages = 0
        self.values: dict[str, Any] = {}
        self._host: dict[str, np.ndarray] = {}  # the arrays under host OrtValues
        self.in_place = bool(getattr(session, "binds_in_place", lambda: False)())

    def _empty(self, spec, pages: int) -> np.ndarray:
        page, width = spec.shape[1], spec.shape[2]
        if not (isinstance(page, int) and isinstance(width, int)):
            raise DSAUserError(f"the cache pool '{spec.name}' has no static page size or width; export the model "
                               "again with --graph paged.")
        dtype = np.uint16 if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
        return np.zeros((pages, page, width), dtype=dtype)

    def grow(self, pages: int) -> None:
        """Pools of at least ``pages`` pages (twice the old size when they must grow), keeping the
        rows already written."""
        if pages <= self.pages:
            return
        if self.limit is not None and pages > self.limit:
            raise DSAUserError(f"the block table names page {pages - 1} but this build's cache pools hold at most "
                               f"{self.limit} pages; run fewer or shorter sequences, or build with a larger "
                               "--max-batch / --max-seq.")
        pages = max(pages, 2 * self.pages, 2)
        if self.limit is not None:
            pages = min(pages, self.limit)
        for name, spec in self.specs.items():
            old = self._host.get(name, self.values.get(name))  # an OrtValue's array, or the runtime's pool
            if old is None:
                self.values[name] = self._wrap(name, self._empty(spec, pages), spec)
            elif isinstance(old, np.ndarray):
                self.values[name] = self._wrap(name, _extend(old, pages), spec)
            else:  # an engine's device pool stays on its device
                self.values[name] = _extend(old, pages)
        self.pages = pages

    def _wrap(self, name: str, array: np.ndarray, spec) -> Any:
        if not self.in_place:
            return array
        import onnxruntime as ort

        self._host[name] = array
        if spec.dtype == "bfloat16":
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, 16)
        return ort.OrtValue.ortvalue_from_numpy(array)

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """One call with the pools fed; the written pools replace the old ones (the same buffers
        when the session binds them in place); returns the other outputs."""
        table = np.asarray(feeds["block_table"])
        self.grow(int(table.max()) + 1 if table.size else 1)
        presents = {PRESENT + name[len(PAST):]: name for name in self.specs}
        resident = getattr(self.session, "run_resident", None)
        if resident is not None:
            # Each present pool into its past pool's buffer where the session can (ONNX Runtime's CPU
            # provider through IO binding, an engine that reports the pair as aliased); else a new buffer.
            out = resident({**feeds, **self.values}, set(presents), alias=presents)
        else:
            out = self.session.run({**feeds, **self.values})
        for present, name in presents.items():
            value = out.pop(present)
            if not self.in_place:
                self.values[name] = value
        return out

    def nbytes(self) -> int:
        total = 0
        for spec in self.specs.values():
            itemsize = 2 if spec.dtype == "bfloat16" else np.dtype(spec.dtype).itemsize
            total += self.pages * spec.shape[1] * spec.shape[2] * itemsize
        return total

    def clear(self) -> None:
        self.values.clear()
        self._host.clear()
        self.pages = 0


def _extend(old: Any, pages: int) -> Any:
    """A device or host pool of ``pages`` pages holding ``old``'s pages first."""
    if isinstance(old, np.ndarray):
        out = np.zeros((pages, *old.shape[1:]), dtype=old.dtype)
        out[: old.shape[0]] = old
        return out
    import torch  # an engine's device tensor

    extra = torch.zeros((pages - old.shape[0], *old.shape[1:]), dtype=old.dtype, device=old.device)
    return torch.cat([old, extra])


__all__ = ["CONTROLS", "PageAllocator", "StagePools", "is_paged", "page_size", "pages_limit", "pool_inputs"]
