"""Every tests/**/test_*.py module is collected by a plain ``python -m pytest`` (the CI command).

pytest skips some folders without a word: its default ``norecursedirs`` has ``build``, which kept
tests/build/ (now tests/artifact/) out of every run until pyproject.toml listed the defaults without it. This test runs
pytest's collection (``--collect-only``, nothing runs) in a subprocess from the repository root
with no arguments, so ``testpaths``, ``norecursedirs`` and ``addopts`` apply as in CI, and checks
that every test module on disk was collected and gave at least one test. A module that fails to
import, one never visited (norecursedirs, --ignore, collect_ignore, python_files) and one with no
tests fail it by name. A module that skips itself (``pytest.importorskip`` at module level) counts
as collected: pytest reports its skip and the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# Run as `python -c PROBE OUT` from the repository root: pytest's own collection, with a plugin that
# records what happened to every collector (module reports keyed by path) and counts tests per file.
PROBE = r"""
import json, sys
import pytest

out = sys.argv[1]
modules, errors, items = {}, {}, {}


class Probe:
    def pytest_collectstart(self, collector):
        if isinstance(collector, pytest.Module):
            modules[collector.nodeid] = {"nodeid": collector.nodeid, "path": str(collector.path),
                                         "outcome": "unreported", "why": ""}

    def pytest_collectreport(self, report):
        why = ""
        if report.failed:
            why = "\n".join(str(report.longrepr).splitlines()[-30:])
            errors[report.nodeid] = why
        elif report.skipped and isinstance(report.longrepr, tuple):
            why = str(report.longrepr[2])
        if report.nodeid in modules:
            modules[report.nodeid].update(outcome=report.outcome, why=why)

    def pytest_itemcollected(self, item):
        items[str(item.path)] = items.get(str(item.path), 0) + 1


code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[Probe()])
with open(out, "w") as f:
    json.dump({"exit": int(code), "modules": list(modules.values()), "errors": errors,
               "items": items}, f)
"""


def _collect(out: Path) -> tuple[dict, str]:
    """What the collection probe recorded, and the tail of what pytest printed."""
    # PYTEST_ADDOPTS is a person's own filter (-k, --lf, -x), not the configuration under test.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert out.exists(), f"the collection probe wrote nothing (exit {proc.returncode}):\n" \
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text()), (proc.stdout[-2000:] + proc.stderr[-2000:]).strip()


def _rel(path: str) -> str:
    """path relative to the repository, as pytest's node ids write it; "" outside it."""
    resolved = Path(path).resolve()
    return resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else ""


def test_every_test_module_is_collected(tmp_path):
    on_disk = sorted(p.relative_to(REPO).as_posix() for p in TESTS.rglob("test_*.py"))
    # Cannot pass on an empty tree, nor without the folder that was skipped once.
    assert "tests/test_collection.py" in on_disk
    assert any(p.startswith("tests/artifact/") for p in on_disk), on_disk

    result, printed = _collect(tmp_path / "collected.json")
    collected = {_rel(m["path"]): m for m in result["modules"] if _rel(m["path"])}
    items = {_rel(p): n for p, n in result["items"].items() if _rel(p)}

    problems = []
    for path in on_disk:
        module = collected.get(path)
        failed_above = [n for n in result["errors"] if n == "" or path.startswith(n + "/")]
        if module is None and failed_above:
            where = failed_above[-1] or "the session"
            problems.append(f"{path}: not collected, {where} failed (below)")
        elif module is None:
            problems.append(f"{path}: never collected (norecursedirs, --ignore, collect_ignore, "
                            f"python_files or testpaths leave it out)")
        elif module["outcome"] == "failed":
            problems.append(f"{path}: fails to collect:\n{module['why']}")
        elif module["outcome"] == "passed" and not items.get(path):
            problems.append(f"{path}: collected, but has no tests")
        elif module["outcome"] not in ("passed", "skipped"):
            problems.append(f"{path}: collection outcome {module['outcome']!r}")
    # A folder or conftest.py that fails takes its modules with it: say why.
    module_ids = {m["nodeid"] for m in result["modules"]}
    for nodeid, why in result["errors"].items():
        if nodeid not in module_ids:
            problems.append(f"collection error in {nodeid or '<session>'}:\n{why}")
    if problems:
        problems.append(f"(pytest --collect-only exited {result['exit']}; output:)\n{printed}")
        pytest.fail("\n\n".join(problems), pytrace=False)
    assert items.get("tests/test_collection.py") == 1, "the probe did not collect this very file"
