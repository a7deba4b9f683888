"""pipeline.json is untrusted: a stage's ``onnx`` can never reach the MODEL resolver as a factory,
and no path in it leads out of its folder, whatever command reads it (build, generate, run)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dsa_export.errors import DSAUserError
from dsa_export.stages.record import PIPELINE_NAME, Pipeline, StageFiles, read_pipeline

PAYLOAD = "from pathlib import Path\n\ndef make(*a, **k):\n    Path(__file__).with_name('RAN').write_text('x')\n    raise SystemExit(0)\n"


def _stage(index: int, layers: tuple[int, int], **fields) -> StageFiles:
    folder = f"stage_{index:02d}"
    base = dict(index=index, layers=layers, embed=index == 0, head=index == 1, onnx=f"{folder}/model.onnx",
                data=f"{folder}/model.onnx.data", sha256={f"{folder}/model.onnx": "0" * 64}, sizes={},
                inputs=[], outputs=[], weight_bytes=0, checkpoint_bytes=0, key="k", plan={})
    base.update(fields)
    return StageFiles(**base)


def _write(folder: Path, stages: list[StageFiles]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder.parent / "outside").mkdir(exist_ok=True)
    pipeline = Pipeline(model={}, model_type="deepseek_v32", num_layers=4, graph="decode", settings={}, plan={},
                        stages=stages, links=[], tool_version="0")
    (folder / PIPELINE_NAME).write_text(json.dumps(pipeline.to_dict()))
    (folder / "evil.py").write_text(PAYLOAD)
    return folder


def _cases(tmp: Path) -> dict[str, list[StageFiles]]:
    outside = tmp / "outside"
    good = [_stage(0, (0, 2)), _stage(1, (2, 4))]
    return {
        "factory": [_stage(0, (0, 2), onnx="evil.py:make"), good[1]],
        "factory-absolute": [_stage(0, (0, 2), onnx=f"{tmp}/evil.py:make"), good[1]],
        "factory-with-onnx-suffix": [_stage(0, (0, 2), onnx="evil.py:make.onnx"), good[1]],
        "onnx-absolute": [_stage(0, (0, 2), onnx=str(outside / "model.onnx")), good[1]],
        "onnx-dotdot": [_stage(0, (0, 2), onnx="../outside/model.onnx"), good[1]],
        "data-dotdot": [_stage(0, (0, 2), data="../outside/model.onnx.data"), good[1]],
        "record-absolute": [_stage(0, (0, 2), sha256={"/etc/passwd": "0" * 64}), good[1]],
        "build-absolute": [_stage(0, (0, 2), build=str(outside)), _stage(1, (2, 4), build="stage_01")],
        "build-dotdot": [_stage(0, (0, 2), build="../outside"), _stage(1, (2, 4), build="stage_01")],
        "reversed": [_stage(1, (2, 4)), _stage(0, (0, 2))],
        "missing-stage": [_stage(0, (0, 2)), _stage(2, (2, 4))],
        "overlap": [_stage(0, (0, 3)), _stage(1, (2, 4))],
        "gap": [_stage(0, (0, 1)), _stage(1, (2, 4))],
        "beyond-model": [_stage(0, (0, 2)), _stage(1, (2, 9))],
        "no-stages": [],
    }


@pytest.mark.parametrize("name", list(_cases(Path("/nonexistent")).keys()))
def test_a_bad_pipeline_is_refused_on_read(tmp_path, name):
    folder = _write(tmp_path / name, _cases(tmp_path)[name])
    with pytest.raises(DSAUserError) as err:
        read_pipeline(folder)
    assert str(folder) in str(err.value)
    assert not (folder / "RAN").exists()


def test_a_symlinked_stage_folder_out_of_the_pipeline_is_refused(tmp_path):
    outside = tmp_path / "outside"
    (outside / "model").mkdir(parents=True)
    folder = _write(tmp_path / "p", [_stage(0, (0, 2)), _stage(1, (2, 4))])
    os.symlink(outside / "model", folder / "stage_00")
    with pytest.raises(DSAUserError, match="link out of the folder"):
        read_pipeline(folder)
    build = _write(tmp_path / "b", [_stage(0, (0, 2), build="stage_00"), _stage(1, (2, 4), build="stage_01")])
    os.symlink(outside, build / "stage_00")
    with pytest.raises(DSAUserError, match="link out of the folder"):
        read_pipeline(build)


def test_the_good_pipeline_reads(tmp_path):
    folder = _write(tmp_path / "ok", [_stage(0, (0, 2)), _stage(1, (2, 4))])
    assert [s.index for s in read_pipeline(folder).stages] == [0, 1]


def _main(args: list[str]) -> int:
    from dsa_export.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


@pytest.mark.parametrize("command", ["build", "generate", "run"])
@pytest.mark.parametrize("name", ["factory", "factory-absolute", "build-dotdot", "onnx-dotdot"])
def test_no_command_runs_or_opens_what_a_pipeline_names(tmp_path, capsys, command, name):
    folder = _write(tmp_path / name, _cases(tmp_path)[name])
    args = {"build": ["build", folder, "-o", tmp_path / "out", "--backend", "onnxruntime"],
            "generate": ["generate", folder, "--input-ids", tmp_path / "ids.npy", "--max-new-tokens", "1"],
            "run": ["run", folder]}[command]
    if command == "generate":
        import numpy as np

        np.save(tmp_path / "ids.npy", np.ones((1, 4), dtype=np.int64))
    assert _main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Internal error" not in err and str(folder) in err
    assert not (folder / "RAN").exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
