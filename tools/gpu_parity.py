#!/usr/bin/env python3
"""The kernels' GPU parity tests without pytest, and small cases for compute-sanitizer.

  python tools/gpu_parity.py --out parity.json [--lib libdsa_kernels.so] [-k SUBSTR] [--require-gpu]
  python tools/gpu_parity.py --collect-only
  python tools/gpu_parity.py --memcheck-cases --out memcheck_cases.json [--lib libdsa_kernels.so]

Default mode: runs tests/plugins/test_kernels_gpu.py and tests/plugins/test_reference_cpu.py through
a small stand-in for the pytest features they use (importorskip, skip, raises, mark.parametrize,
fixture), so a GPU machine without pytest runs the very same cases; tools/gpu_check.sh uses it when
``import pytest`` fails. The ``cuda_kernels`` fixture is built as tests/plugins/conftest.py builds
it. Every test's outcome is written to the JSON as soon as it finishes, so a run killed by its
timeout keeps what it did. ``--require-gpu`` turns a missing CUDA device or kernel library into a
failure instead of a skip.

``--memcheck-cases``: a few small shapes of every kernel (indexer top-k on the tensor-core and
generic paths, sparse attention with an explicit v and with values from keys on both paths and at
MLA width, routed experts bf16 on every kernel family, FP8 and fp32), with inputs built on the host
and copied to the device, so that under ``compute-sanitizer --tool memcheck`` few kernels besides
ours run. Each output is still compared with the float64 references.

Exit status: 0 when nothing failed and at least one case passed, 1 when a case failed, 2 when
nothing passed (e.g. no GPU without --require-gpu), 3 on bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
import types
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_MODULES = ("tests.plugins.test_kernels_gpu", "tests.plugins.test_reference_cpu")


class Skipped(Exception):
    """A test (or its module, or a fixture) asked to be skipped."""


# ---------------------------------------------------------------------------------------------
# The stand-in for pytest: only what the two test modules use.


class _Raises:
    def __init__(self, expected, match=None):
        self.expected = expected
        self.match = match
        self.value = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(exc_type, self.expected):
            return False
        if self.match is not None and not re.search(self.match, str(exc)):
            raise AssertionError(f"pattern {self.match!r} not found in {str(exc)!r}")
        self.value = exc
        return True


class _NoOpMark:
    """pytest.mark.<anything but parametrize>: usable as a decorator and as a module's pytestmark."""

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return self


class _Mark:
    @staticmethod
    def parametrize(argnames, argvalues, ids=None, **_ignored):
        names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
        values = list(argvalues)

        def decorate(fn):
            fn.__dict__.setdefault("_parity_params", []).insert(0, (names, values, ids))
            return fn

        return decorate

    def __getattr__(self, name):
        return _NoOpMark()


def _raises(expected, *args, match=None, **kwargs):
    if args:  # pytest.raises(Exc, fn, *args): the call form
        with _Raises(expected, match) as ctx:
            args[0](*args[1:], **kwargs)
        return ctx
    return _Raises(expected, match)


def _importorskip(name, minversion=None, reason=None):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise Skipped(reason or f"could not import {name!r}: {exc}") from exc


def _skip(reason="", **_ignored):
    raise Skipped(reason)


def _fixture(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


def install_pytest_shim() -> types.ModuleType:
    shim = types.ModuleType("pytest")
    shim.__doc__ = "tools/gpu_parity.py's stand-in for the few pytest features the kernel tests use"
    shim.importorskip = _importorskip
    shim.skip = _skip
    shim.skip.Exception = Skipped
    shim.raises = _raises
    shim.mark = _Mark()
    shim.fixture = _fixture
    sys.modules["pytest"] = shim
    return shim


# ---------------------------------------------------------------------------------------------
# Fixtures.


class Fixtures:
    def __init__(self, lib: Path | None, require_gpu: bool):
        self.lib = lib
        self.require_gpu = require_gpu
        self._kernels = None
        self._kernels_error: BaseException | None = None

    def cuda_kernels(self):
        if self._kernels is None and self._kernels_error is None:
            try:
                self._kernels = self._load()
            except BaseException as exc:  # noqa: BLE001 - remembered and re-raised per test
                self._kernels_error = exc
        if self._kernels_error is not None:
            raise self._kernels_error
        return self._kernels

    def _load(self):
        import torch

        if not torch.cuda.is_available():
            self._missing("needs a CUDA device (torch.cuda.is_available() is False)")
        from dsa_export.plugins import find_library
        from dsa_export.plugins.kernels import load_kernels

        path = self.lib if self.lib is not None else find_library("kernels")
        if path is None or not Path(path).is_file():
            self._missing(f"libdsa_kernels.so is not built (looked for {path or 'the default locations'})")
        return load_kernels(path)

    def _missing(self, why: str):
        if self.require_gpu:
            raise RuntimeError(why)
        raise Skipped(why)

    def get(self, name: str):
        if name == "cuda_kernels":
            return self.cuda_kernels()
        if name == "tmp_path":
            return Path(tempfile.mkdtemp(prefix="gpu-parity-"))
        raise RuntimeError(f"tools/gpu_parity.py has no fixture {name!r}; run this test under pytest")


# ---------------------------------------------------------------------------------------------
# Collection and running.


def _param_id(value, name: str, index: int) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)
    return f"{name}{index}"


def expand(fn) -> list[tuple[str, dict]]:
    """(id suffix, arguments) of every parametrized call of fn, as pytest would collect them."""
    groups = []
    for names, values, ids in getattr(fn, "_parity_params", []):
        options = []
        for i, value in enumerate(values):
            row = value if len(names) > 1 else (value,)
            label = ids[i] if ids is not None else "-".join(_param_id(v, n, i) for n, v in zip(names, row))
            options.append((str(label), dict(zip(names, row))))
        groups.append(options)
    calls = []
    for combo in itertools.product(*groups):
        label = "-".join(c[0] for c in combo)
        args = {}
        for _, part in combo:
            args.update(part)
        calls.append((f"[{label}]" if combo else "", args))
    return calls


def collect(module_name: str):
    """(test ids, callables) of a module, or (module id, Skipped) when the module skips itself."""
    try:
        module = importlib.import_module(module_name)
    except Skipped as exc:
        return [(module_name, exc)]
    items = []
    for name, obj in list(vars(module).items()):
        if not name.startswith("test") or not inspect.isfunction(obj) or obj.__module__ != module.__name__:
            continue
        for suffix, params in expand(obj):
            items.append((f"{module_name.replace('.', '/')}.py::{name}{suffix}", (obj, params)))
    return items


def run_item(fn, params: dict, fixtures: Fixtures):
    kwargs = {}
    for pname in inspect.signature(fn).parameters:
        kwargs[pname] = params[pname] if pname in params else fixtures.get(pname)
    return fn(**kwargs)


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, path)


def run_tests(args) -> int:
    install_pytest_shim()
    if args.collect_only:  # the test ids, as `pytest --collect-only -q` prints them
        for module_name in args.module:
            for test_id, item in collect(module_name):
                if not isinstance(item, Skipped) and (not args.k or args.k in test_id):
                    print(test_id)
        return 0
    fixtures = Fixtures(args.lib, args.require_gpu)
    doc = {"runner": "tools/gpu_parity.py", "modules": list(args.module), "filter": args.k,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "finished": False,
           "counts": {"passed": 0, "failed": 0, "skipped": 0}, "tests": []}
    write_json(args.out, doc)
    for module_name in args.module:
        for test_id, item in collect(module_name):
            if isinstance(item, Skipped):
                doc["tests"].append({"id": test_id, "status": "skipped", "reason": str(item), "seconds": 0.0})
                doc["counts"]["skipped"] += 1
                write_json(args.out, doc)
                continue
            if args.k and args.k not in test_id:
                continue
            start = time.monotonic()
            entry = {"id": test_id}
            try:
                run_item(*item, fixtures)
                entry["status"] = "passed"
            except Skipped as exc:
                entry.update(status="skipped", reason=str(exc))
            except BaseException as exc:  # noqa: BLE001 - a failing test is recorded, the run goes on
                if isinstance(exc, KeyboardInterrupt):
                    raise
                entry.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000],
                             traceback=traceback.format_exc(limit=4)[-3000:])
            entry["seconds"] = round(time.monotonic() - start, 3)
            doc["counts"][entry["status"]] += 1
            doc["tests"].append(entry)
            print(f"{test_id} {entry['status'].upper()} ({entry['seconds']:.1f}s)"
                  + (f": {entry.get('error') or entry.get('reason')}" if entry["status"] != "passed" else ""),
                  flush=True)
            write_json(args.out, doc)
    doc["finished"] = True
    write_json(args.out, doc)
    counts = doc["counts"]
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped", flush=True)
    if counts["failed"]:
        return 1
    return 0 if counts["passed"] else 2


# ---------------------------------------------------------------------------------------------
# Small cases for compute-sanitizer.


def memcheck_cases(kern, t):
    """(name, thunk) pairs; a thunk runs one small kernel call and checks it, returning details."""
    import torch

    ref = t.ref

    def indexer(name, B, S, T, H, D, topk, dtype, w_dtype, lengths=None, causal=True):
        def thunk():
            gen = t._gen(zlib.crc32(name.encode()))
            q = t._randn((B, S, H, D), dtype, gen)
            k = t._randn((B, T, D), dtype, gen)
            w = t._randn((B, S, H), w_dtype, gen, scale=H ** -0.5)
            lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32).cuda()
            got = kern.indexer_topk(q, k, w, lens, topk=topk, scale=D ** -0.5, causal=causal)
            torch.cuda.synchronize()
            ties = t.assert_same_selection(got, q, k, w, lens, topk=topk, scale=D ** -0.5, causal=causal)
            return {"path": kern.indexer_topk_path(H, D, dtype), "rows_differing_on_ties": ties}

        return name, thunk

    def attention(name, B, S, T, H, Hkv, Dk, Dv, K, dtype, from_keys):
        def thunk():
            gen = t._gen(zlib.crc32(name.encode()))
            q = t._randn((B, S, H, Dk), dtype, gen)
            k = t._randn((B, T, Hkv, Dk), dtype, gen)
            v = k[:, :0, :, :Dv] if from_keys else t._randn((B, T, Hkv, Dv), dtype, gen)
            idx = t._indices(B, S, T, K, gen)
            got = kern.sparse_attention(q, k, v, idx, scale=Dk ** -0.5)
            torch.cuda.synchronize()
            want = t._ops_reference_attention(q, k, v, idx, scale=Dk ** -0.5)
            err = (got.double().cpu() - want.double()).abs().max().item()
            bound = t.ATTN_TOL[dtype] * max(want.abs().max().item(), 1e-3)
            assert math.isfinite(err) and err <= bound, f"max abs error {err:.3e} > {bound:.3e}"
            return {"path": kern.sparse_attention_path(H, Hkv, Dk, Dv, dtype), "max_err": err, "bound": bound}

        return name, thunk

    def moe(name, N, K, E, H, I, dtype, fp8=False, block_size=128, path=None):
        def thunk():
            args = t._moe_case(N, K, E, H, I, dtype, fp8=fp8, block_size=block_size, seed=zlib.crc32(name.encode()) % 100003)
            got = kern.moe_experts(*args, block_size=block_size, path=path)
            torch.cuda.synchronize()
            host = [a.cpu() if a is not None else None for a in args]
            want = ref.moe_experts(*host, block_size=block_size)
            scale = max(want.abs().max().item(), 1e-6)
            err = (got.double().cpu() - want).abs().max().item()
            tol = t.MOE_TOL[(dtype, fp8)]
            assert math.isfinite(err) and err <= tol * scale, f"max abs error {err:.3e} > {tol} * {scale:.3e}"
            return {"path": path or kern.moe_experts_path(N, K, E, H, I, dtype, torch.float8_e4m3fn if fp8 else None,
                                                          block_size),
                    "max_rel_err": err / scale, "tol": tol}

        return name, thunk

    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    cases = [
        indexer("indexer-tc-bf16", 1, 5, 300, 16, 64, 32, bf16, fp32),
        indexer("indexer-lengths-fp16", 2, 4, 200, 16, 64, 40, fp16, fp16, lengths=[200, 77]),
        indexer("indexer-generic-fp32", 1, 3, 150, 16, 40, 20, fp32, fp32),
    ]
    for from_keys in (False, True):
        tag = "values-from-keys" if from_keys else "explicit-v"
        cases += [
            attention(f"attention-tc-{tag}-bf16", 1, 3, 100, 16, 1, 144, 128, 40, bf16, from_keys),
            attention(f"attention-generic-{tag}-bf16", 1, 2, 80, 8, 2, 72, 40, 33, bf16, from_keys),
            attention(f"attention-generic-{tag}-fp32", 1, 2, 80, 4, 2, 72, 40, 33, fp32, from_keys),
            attention(f"attention-mla-576-512-h64-{tag}-bf16", 1, 2, 300, 64, 1, 576, 512, 256, bf16, from_keys),
        ]
    cases += [moe(f"moe-bf16-{p}", 40, 4, 8, 128, 64, bf16, path=p)
              for p in ("generic", "tensor-core-16", "tensor-core-64", "tensor-core-128")]
    cases += [
        moe("moe-fp8-bf16", 9, 4, 8, 256, 128, bf16, fp8=True),
        moe("moe-fp32-generic", 5, 2, 4, 64, 48, fp32),
    ]
    return cases


def run_memcheck_cases(args) -> int:
    install_pytest_shim()
    doc = {"runner": "tools/gpu_parity.py --memcheck-cases", "finished": False,
           "counts": {"passed": 0, "failed": 0}, "cases": []}
    write_json(args.out, doc)
    try:
        t = importlib.import_module("tests.plugins.test_kernels_gpu")
        kern = Fixtures(args.lib, require_gpu=True).cuda_kernels()
    except BaseException as exc:  # noqa: BLE001
        doc.update(error=f"{type(exc).__name__}: {exc}", finished=True)
        write_json(args.out, doc)
        print(doc["error"], file=sys.stderr)
        return 2
    for name, thunk in memcheck_cases(kern, t):
        if args.k and args.k not in name:
            continue
        start = time.monotonic()
        entry = {"case": name}
        try:
            entry.update(thunk())
            entry["status"] = "passed"
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            entry.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        entry["seconds"] = round(time.monotonic() - start, 3)
        doc["counts"][entry["status"]] += 1
        doc["cases"].append(entry)
        print(json.dumps(entry), flush=True)
        write_json(args.out, doc)
    doc["finished"] = True
    write_json(args.out, doc)
    if doc["counts"]["failed"]:
        return 1
    return 0 if doc["counts"]["passed"] else 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (rewritten after every case)")
    parser.add_argument("--collect-only", action="store_true", help="print the test ids and exit")
    parser.add_argument("--lib", type=Path, default=None, help="libdsa_kernels.so (default: the loader's search)")
    parser.add_argument("-k", default=None, help="run only the tests / cases whose id contains this")
    parser.add_argument("--module", action="append", default=None,
                        help=f"test module to run (repeatable; default: {', '.join(DEFAULT_MODULES)})")
    parser.add_argument("--require-gpu", action="store_true",
                        help="a missing CUDA device or kernel library fails the GPU tests instead of skipping them")
    parser.add_argument("--memcheck-cases", action="store_true", help="run the small cases for compute-sanitizer")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 3 if exc.code else 0
    if args.module is None:
        args.module = list(DEFAULT_MODULES)
    if args.out is None and not args.collect_only:
        parser.print_usage(sys.stderr)
        print("gpu_parity.py: --out is required", file=sys.stderr)
        return 3
    return run_memcheck_cases(args) if args.memcheck_cases else run_tests(args)


if __name__ == "__main__":
    sys.exit(main())
