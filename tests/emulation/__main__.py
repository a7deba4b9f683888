"""Run the project's CUDA kernels on the CPU emulator.

    python -m tests.emulation                      # every small case under every schedule (what CI runs)
    python -m tests.emulation --real-width         # DeepSeek-V3.2 widths (minutes per case)
    python -m tests.emulation --case NAME --seed 7 --schedule scrambled-copies-at-issue
    python -m tests.emulation --mutations          # each injected bug must fail; exit 1 if one passes

Prints one line per case and schedule with its time, then a summary; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback

from .cases import CASES, REAL_WIDTH_CASES, SMALL_CASES
from .harness import DEFAULT_SCHEDULES, COPIES, ORDERS, EmulatedKernels, Schedule, run_case
from .mutations import MUTANTS, MUTANTS_BY_NAME


def _schedule(name: str) -> Schedule:
    for s in DEFAULT_SCHEDULES:
        if s.name == name:
            return s
    order, _, copies = name.partition("-copies-at-")
    if order not in ORDERS or copies not in COPIES:
        raise SystemExit(f"unknown schedule {name!r}; use ORDER-copies-at-MODE with ORDER in {sorted(ORDERS)} "
                         f"and MODE in {sorted(COPIES)}")
    return Schedule(order, copies, resident_ctas=3 if order == "scrambled" else 2)


def run_cases(cases, schedules, *, seed: int, patches=(), stop_at_first: bool = False, quiet: bool = False,
              kl: EmulatedKernels | None = None) -> int:
    kl = kl or EmulatedKernels(patches)
    failures = 0
    total = time.perf_counter()
    for case in cases:
        for schedule in schedules:
            if case.schedules is not None and schedule.name not in case.schedules:
                continue
            t0 = time.perf_counter()
            try:
                run_case(kl, case, schedule, seed)
                status = "ok"
            except Exception as exc:  # noqa: BLE001 - every failure is reported with its case and seed
                failures += 1
                status = f"FAIL: {type(exc).__name__}: {exc}".replace("\n", " ")[:400]
                if not quiet and os.environ.get("DSA_EMU_TRACEBACK"):
                    traceback.print_exc()
            if not quiet or status != "ok":
                print(f"{case.name:38s} {schedule.name:28s} seed {case.seed(seed):>10d} "
                      f"{time.perf_counter() - t0:7.2f} s  {status}", flush=True)
            if failures and stop_at_first:
                return failures
    if not quiet:
        n = sum(1 for c in cases for s in schedules if c.schedules is None or s.name in c.schedules)
        print(f"{n - failures} passed, {failures} failed ({time.perf_counter() - total:.1f} s; "
              f"{kl.stats()['switches']} fiber switches)")
    return failures


def run_mutations(seed: int, only: list[str] | None, timeout: float) -> int:
    """Each mutant in a child process (a mutant may crash or hang): caught = the child fails."""
    missed = []
    for mutant in MUTANTS:
        if only and mutant.name not in only:
            continue
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "tests.emulation", "--mutant", mutant.name, "--seed", str(seed)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            caught = proc.returncode != 0
            lines = proc.stdout.strip().splitlines()
            detail = lines[-1] if lines else (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            first = next((ln for ln in lines if "FAIL" in ln), "")
            if first:
                detail += "; first: " + first.split("FAIL: ", 1)[-1][:160]
        except subprocess.TimeoutExpired:
            caught, detail = True, f"hung (killed after {timeout:.0f} s)"
        verdict = "caught" if caught else "MISSED"
        print(f"{mutant.name:36s} {verdict:7s} {time.perf_counter() - t0:6.1f} s  {detail[:300]}", flush=True)
        if not caught:
            missed.append(mutant.name)
    print(f"{len(missed)} of the injected bugs passed the harness: {missed}" if missed
          else "every injected bug was caught")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.emulation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real-width", action="store_true", help="the DeepSeek-V3.2-width cases instead of the small ones")
    ap.add_argument("--case", action="append", help="only this case (repeatable); see --list")
    ap.add_argument("--schedule", action="append", help="only this schedule, e.g. lockstep-copies-at-wait")
    ap.add_argument("--seed", type=int, default=0, help="varies every case's inputs and random schedule (default 0)")
    ap.add_argument("--list", action="store_true", help="list cases, schedules and mutants")
    ap.add_argument("--mutations", action="store_true", help="run the mutation check")
    ap.add_argument("--only-mutant", action="append", help="with --mutations: only this mutant")
    ap.add_argument("--mutant", help=argparse.SUPPRESS)  # child process of --mutations
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant (default 600)")
    args = ap.parse_args(argv)

    if args.list:
        for c in SMALL_CASES + REAL_WIDTH_CASES:
            print(f"case     {c.name:38s} {c.kernel:12s} {c.device}")
        for s in DEFAULT_SCHEDULES:
            print(f"schedule {s.name}")
        for m in MUTANTS:
            print(f"mutant   {m.name:36s} {m.why}")
        return 0
    if args.mutations:
        return run_mutations(args.seed, args.only_mutant, args.timeout)
    schedules = [_schedule(s) for s in args.schedule] if args.schedule else list(DEFAULT_SCHEDULES)
    if args.mutant:
        # Which schedules catch the bug: each runs the family's cases until its first failure.
        mutant = MUTANTS_BY_NAME[args.mutant]
        cases = [c for c in SMALL_CASES if c.kernel == mutant.kernel]
        kl = EmulatedKernels(mutant.patches)
        caught_by = [s.name for s in schedules
                     if run_cases(cases, [s], seed=args.seed, stop_at_first=True, quiet=True, kl=kl)]
        print(f"caught by {len(caught_by)} of {len(schedules)} schedules: {', '.join(caught_by) or 'none'}")
        return 1 if caught_by else 0
    if args.case:
        unknown = [n for n in args.case if n not in CASES]
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; see --list")
        cases = [CASES[n] for n in args.case]
    else:
        cases = REAL_WIDTH_CASES if args.real_width else SMALL_CASES
    return 1 if run_cases(cases, schedules, seed=args.seed) else 0


if __name__ == "__main__":
    sys.exit(main())
