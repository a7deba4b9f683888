"""The rough edges a new user meets, each held in place: a slow torch import is "not probed", not
missing; ``export --stages`` writes the decode graphs ``build`` and ``generate`` need; one
``--max-seq`` default; one spelling of bench's JSON option; the demo build says what it is doing
during its export; ``run FILE.onnx`` says which sizes to pass; an interrupted stage export leaves
no empty folder; no progress bars in logs; ``--samples`` beyond the data says so; no raw Python
errors in messages. Everything here runs in seconds (no model is traced but one Linear layer).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dsa_export.errors import DSAUserError

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "compat" / "fixtures" / "cpu_only.json"


def _main(args: list) -> int:
    from dsa_export.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


def _linear_onnx(path: Path, reference: dict | None = None) -> Path:
    """``y = x @ w`` with x ``[batch, sequence, 16]``: a file with dynamic dims and a MatMul to quantize."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 16])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    if reference is not None:
        helper.set_model_props(model, {"dsa_export.reference": json.dumps(reference)})
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


# --- a. check: a slow import is not probed, not missing ------------------------------------------


def test_a_slow_import_is_waited_for_and_a_timeout_is_not_probed(monkeypatch):
    from dsa_export.cli.check_cmd import render_table
    from dsa_export.compat import probe as probe_module
    from dsa_export.compat.probe import probe_environment
    from dsa_export.compat.records import ComponentRecord, ProbeSettings
    from dsa_export.compat.rules import CheckSettings, run_checks

    assert probe_module.DEFAULT_IMPORT_TIMEOUT_S >= 60

    def slow_torch(settings):
        time.sleep(0.6)  # longer than the tool probes' budget below: an import gets its own
        return ComponentRecord("torch", True, "2.13.0", details={"cuda": None})

    def hung_nvcc(settings):
        time.sleep(10)
        return ComponentRecord("nvcc", True, "0")

    monkeypatch.setitem(probe_module.PROBES, "torch", slow_torch)
    monkeypatch.setitem(probe_module.PROBES, "nvcc", hung_nvcc)
    monkeypatch.setattr(probe_module, "DEFAULT_PROBE_TIMEOUT_S", 0.2)
    result = probe_environment(ProbeSettings(components=("torch", "nvcc")))
    assert result.component("torch").found and result.component("torch").version == "2.13.0"
    nvcc = result.component("nvcc")
    assert not nvcc.found and nvcc.reason == "not probed (timed out after 0.2 s; raise --timeout)"

    # An explicit --timeout bounds the imports too; what it cuts off is "not probed".
    result = probe_environment(ProbeSettings(timeout_s=0.2, components=("torch",)))
    torch_record = result.component("torch")
    assert torch_record.details == {"timed_out_s": 0.2} and torch_record.reason.startswith("not probed (timed out")
    report = run_checks(CheckSettings(), result)
    ids = {f.id for f in report.findings}
    assert "torch_not_probed" in ids and "torch_missing" not in ids
    line = next(line for line in render_table(report).splitlines() if line.strip().startswith("torch "))
    assert "not probed" in line and "missing" not in line


# --- b, c. export --stages writes decode graphs; one --max-seq default ---------------------------


@pytest.mark.parametrize("extra,graph", [([], "decode"), (["--graph", "prefill"], "prefill")])
def test_stage_export_writes_decode_graphs_by_default(monkeypatch, tmp_path, extra, graph):
    from dsa_export.stages.plan import DEFAULT_MAX_SEQ

    seen = {}

    def export_stages(model, output, settings, **kwargs):
        seen["settings"] = settings
        raise DSAUserError("stopped here by the test.")

    monkeypatch.setattr("dsa_export.stages.export.export_stages", export_stages)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert _main(["export", tmp_path / "ckpt", "--stages", "2", "-o", tmp_path / "out", *extra]) == 1
    assert seen["settings"].graph == graph and seen["settings"].max_seq == DEFAULT_MAX_SEQ


def test_plan_export_and_build_share_the_max_seq_default():
    import inspect

    from dsa_export.cli import build_cmd, export_cmd, plan_cmd
    from dsa_export.stages.builder import build_stages
    from dsa_export.stages.export import StageExportSettings
    from dsa_export.stages.plan import DEFAULT_MAX_SEQ

    defaults = {name: next(p.default for p in module.command.params if p.name == "max_seq")
                for name, module in (("plan", plan_cmd), ("export", export_cmd), ("build", build_cmd))}
    assert defaults == {"plan": DEFAULT_MAX_SEQ, "export": DEFAULT_MAX_SEQ, "build": DEFAULT_MAX_SEQ}
    assert StageExportSettings().max_seq == DEFAULT_MAX_SEQ
    assert inspect.signature(build_stages).parameters["max_seq"].default == DEFAULT_MAX_SEQ


# --- d. bench's JSON option: one spelling -------------------------------------------------------


def test_bench_json_is_one_flag_in_help_and_docs_and_the_old_forms_still_parse():
    from dsa_export.cli.bench_cmd import command

    help_text = command.get_help(command.make_context("bench", ["--json"]))
    assert re.search(r"^\s+--json\s{2,}Print the report as JSON on stdout", help_text, re.M), help_text
    assert "--json [FILE]" not in help_text and "--json FILE" not in help_text
    parse = {args[-1]: command.make_context("bench", list(args)).params["json_arg"]
             for args in (["--json"], ["--json", "-"], ["--json", "old.json"])}
    assert parse["--json"] == Path("-") or str(parse["--json"]) == "-"
    assert str(parse["-"]) == "-" and str(parse["old.json"]) == "old.json"
    # Every documented bench command writes a JSON file with --json-out, never with --json FILE.
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for line in doc.read_text().splitlines():
            if "dsa-export bench" in line:
                assert not re.search(r"--json (?![-\[|])\S", line), (doc.name, line)
                assert "--json OUT" not in line, (doc.name, line)


# --- e. the demo build's export stage says what it is doing --------------------------------------


def test_the_export_stage_prints_its_phases(monkeypatch, tmp_path):
    from dsa_export.artifact import BuildSettings, build
    from dsa_export.artifact.builder import EXPORT_TIME_NOTE
    from dsa_export.compat.records import load_snapshot

    def export_model(source, settings, *, step=None):
        step("tracing with torch.export and translating to ONNX")
        step("optimizing the ONNX graph")
        raise DSAUserError("stopped here by the test.")

    monkeypatch.setattr("dsa_export.export.export_model", export_model)
    lines: list[str] = []
    with pytest.raises(DSAUserError, match="stopped here"):
        build(BuildSettings(output=tmp_path / "demo", backend="onnxruntime"), log=lines.append,
              probe=load_snapshot(SNAPSHOT))
    assert f"[1/5] export: tracing with torch.export and translating to ONNX ({EXPORT_TIME_NOTE}) ..." in lines
    assert any(re.fullmatch(r"\[1/5\] export: optimizing the ONNX graph \(\d+ s so far\) \.\.\.", line)
               for line in lines), lines
    assert not (tmp_path / "demo").exists()


def test_export_model_reports_each_phase(tmp_path):
    from dsa_export.export import ExportSettings, export_model
    from dsa_export.sources import resolve

    (tmp_path / "f.py").write_text(
        "import torch\n\ndef make(batch=2, seq_len=8):\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Linear(8, 8).eval(), (torch.randn(batch, seq_len, 8),), ['y']\n")
    steps: list[str] = []
    export_model(resolve(f"{tmp_path / 'f.py'}:make"), ExportSettings(), step=steps.append)
    assert steps == ["tracing with torch.export and translating to ONNX", "optimizing the ONNX graph"]


def test_the_documented_demo_time_is_the_one_the_build_prints():
    from dsa_export.artifact.builder import EXPORT_TIME_NOTE

    text = (ROOT / "docs" / "build.md").read_text()
    assert "20 to 40 s" not in text and "20–40 s" not in text
    assert EXPORT_TIME_NOTE.split("about ")[1].split(" for")[0] in text  # "20-60 s" of the export stage


# --- f. run FILE.onnx without sizes -------------------------------------------------------------


def test_run_of_a_bare_onnx_says_which_sizes_to_pass(tmp_path, capsys):
    model = _linear_onnx(tmp_path / "m.onnx")
    assert _main(["run", model]) == 2
    err = capsys.readouterr().err
    assert "--dims" in err and "batch, sequence" in err and "--inputs" in err and "manifest gives none" not in err
    assert _main(["run", model, "--dims", "batch=1,sequence=4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"][0]["shape"] == [1, 4, 16]


# --- g. an interrupted stage export leaves no empty folder ---------------------------------------


@pytest.fixture()
def no_checkpoint_reading(monkeypatch):
    monkeypatch.setattr("dsa_export.hf.loader.inspect_checkpoint", lambda path: SimpleNamespace(fp8=False))
    monkeypatch.setattr("dsa_export.stages.plan.plan_stages", lambda *args, **kwargs: SimpleNamespace(stages=[]))


def test_a_stage_export_stopped_before_any_stage_removes_the_folder_it_made(no_checkpoint_reading, monkeypatch,
                                                                            tmp_path):
    from dsa_export import interrupts
    from dsa_export.stages import export as stages

    out = tmp_path / "new" / "stages"
    registered = []

    def interrupted(*args, **kwargs):
        (out / "stage_00").mkdir()  # what an export in progress leaves
        # For the watchdog, if the process has to be ended: the outermost folder this run created.
        registered.append(tmp_path / "new" in interrupts._temporaries.values())
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "_export_stages", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stages.export_stages(tmp_path, out, stages.StageExportSettings(stages=2))
    assert not out.exists() and not (tmp_path / "new").exists()
    assert registered == [True] and tmp_path / "new" not in interrupts._temporaries.values()

    # A folder that was there before is the user's: it stays.
    out.mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt):
        stages.export_stages(tmp_path, out, stages.StageExportSettings(stages=2))
    assert out.is_dir() and registered == [True, False]


def test_a_stage_export_stopped_after_a_stage_keeps_it_for_the_next_run(no_checkpoint_reading, monkeypatch,
                                                                        tmp_path):
    from dsa_export import interrupts
    from dsa_export.stages import export as stages

    out = tmp_path / "stages"

    def one_stage_then_interrupted(*args, on_first_stage=None, **kwargs):
        (out / "pipeline.json").write_text("{}")
        on_first_stage()
        assert not interrupts._temporaries
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "_export_stages", one_stage_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        stages.export_stages(tmp_path, out, stages.StageExportSettings(stages=2))
    assert (out / "pipeline.json").is_file()


# --- h. no progress bars in logs ----------------------------------------------------------------

_SHOW = ("from dsa_export import quiet; quiet.set_debug({debug}); quiet.configure(); import os, tqdm; "
         "print(os.environ.get('TQDM_DISABLE'), os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'), "
         "quiet.progress_bars(), tqdm.tqdm(total=1).disable)")


@pytest.mark.parametrize("debug", [False, True])
def test_no_progress_bars_when_stderr_is_not_a_terminal(debug):
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    result = subprocess.run([sys.executable, "-c", _SHOW.format(debug=debug)], capture_output=True, text=True,
                            env={**env, "PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    assert result.stdout.split() == ["1", "1", "False", "True"]


def test_progress_bars_on_a_terminal():
    pty = pytest.importorskip("pty")
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    leader, follower = pty.openpty()
    try:
        result = subprocess.run([sys.executable, "-c", _SHOW.format(debug=True)], stdout=subprocess.PIPE,
                                stderr=follower, text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=60,
                                check=True)
    finally:
        os.close(follower)
        os.close(leader)
    assert result.stdout.split() == ["None", "None", "True", "False"]


# --- i. --samples beyond the data ---------------------------------------------------------------


def test_samples_beyond_the_data_are_a_warning_on_stderr_and_in_json(tmp_path, capsys):
    model = _linear_onnx(tmp_path / "m.onnx")
    (tmp_path / "calib").mkdir()
    for i in range(3):
        np.savez(tmp_path / "calib" / f"{i}.npz",
                 x=np.random.default_rng(i).standard_normal((1, 4, 16)).astype(np.float32))
    assert _main(["calibrate", model, "-o", tmp_path / "q.onnx", "--data", tmp_path / "calib", "--samples", "50",
                  "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["calibration_samples"] == 3 and report["samples_requested"] == 50
    assert report["warnings"] == ["--samples 50 asked for 50 calibration samples but the data holds only 3; "
                                  "calibrated on all 3."]
    assert f"Warning: {report['warnings'][0]}" in err


# --- j. messages that read like raw Python errors ------------------------------------------------


@pytest.mark.parametrize("content,words", [
    ("[1, 2]", "holds a JSON list"),
    ('{"schema_version": 1, "components": {"torch": 3}}', "is not an object with the expected fields"),
    ('{"schema_version": 1, "gpus": [{}]}', "lacks its 'index' field"),
])
def test_a_bad_snapshot_is_one_plain_sentence(tmp_path, capsys, content, words):
    (tmp_path / "s.json").write_text(content)
    assert _main(["check", "--snapshot", tmp_path / "s.json"]) == 1
    err = capsys.readouterr().err
    assert words in err and "Error" not in err.replace("Error: ", "", 1)  # no AttributeError / TypeError


def test_calibration_data_of_the_wrong_kind_is_a_usage_error(tmp_path, capsys):
    model = _linear_onnx(tmp_path / "m.onnx")
    (tmp_path / "data.json").write_text("{}")
    assert _main(["calibrate", model, "-o", tmp_path / "q.onnx", "--data", tmp_path / "data.json"]) == 2
    err = capsys.readouterr().err
    assert "is neither a folder of .npz/.npy inputs" in err and "pickle" not in err and "ValueError" not in err


def test_a_supplied_file_names_its_factory_where_it_is(tmp_path, monkeypatch):
    """The validate stage's note about a file whose reference is a factory names the factory's real path."""
    from dsa_export.artifact import BuildSettings, build
    from dsa_export.compat.records import load_snapshot

    model = _linear_onnx(tmp_path / "a" / "m.onnx",
                         {"version": 1, "kind": "factory", "name": "make", "path": "f.py", "relative": True})
    lines: list[str] = []
    build(BuildSettings(model=str(model), output=tmp_path / "b" / "out", backend="onnxruntime"), log=lines.append,
          probe=load_snapshot(SNAPSHOT))
    note = next(line for line in lines if line.startswith("[2/5] validate: skipped"))
    assert f"{tmp_path / 'a' / 'f.py'}:make" in note, note
