"""Bad inputs across every command end the same way: exit 1 (a user error) or 2 (a wrong command
line), one sentence on stderr, no traceback, no "Internal error", no partial output file, and the
inputs unchanged. The cases run in-process through the CLI's entry point (``main``), so the whole
list costs about as much as importing torch once; exit codes under real signals are in
test_interrupts.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.conftest import MARKER

LONG = "a" * 300

# (argv with {w} = the bad-input folder and {b} = its damaged build copies, exit code, part of the message)
CASES: list[tuple[str, int, str]] = [
    # plan
    ("plan {w}/nothing --gpu-memory 80GiB", 1, "nothing"),
    ("plan {w}/notes.txt --gpu-memory 80GiB", 1, "notes.txt"),
    ("plan {w}/foreign --gpu-memory 80GiB --gpus 0", 2, "Invalid value"),
    # export
    ("export no-such-model -o {w}/out/x.onnx", 1, "neither a built-in model"),
    ("export {w}/missing.py:make -o {w}/out/x.onnx", 1, "does not exist"),
    ("export {w}/folder.py:make -o {w}/out/x.onnx", 1, "is a folder"),
    ("export {w}/factories.py -o {w}/out/x.onnx", 1, "names no factory"),
    ("export {w}/factories.py:nothing -o {w}/out/x.onnx", 1, "has no callable"),
    ("export {w}/factories.py:raising -o {w}/out/x.onnx", 1, "raised RuntimeError"),
    ("export {w}/factories.py:same_name -o {w}/out/x.onnx", 1, "like one of its inputs"),
    ("export {w}/factories.py:not_a_module -o {w}/out/x.onnx", 1, "must return"),
    ("export {w}/factories.py:branchy -o {w}/out/x.onnx", 1, "factories.py:"),
    ("export {w}/factories.py:raising -o {w}/factories.py", 2, "model file itself"),
    ("export -o {w}/folder.onnx", 2, "is a folder"),
    ("export -o /sys/dsa-export-test.onnx", 1, "cannot be written"),
    ("export -o {w}/blocker/x.onnx", 1, "is a file, not a folder"),
    (f"export -o {{w}}/out/{LONG}.onnx", 1, "longer than"),
    ("export --layers 5:2 -o {w}/out/x.onnx", 2, "A must be smaller"),
    ("export --layers two -o {w}/out/x.onnx", 2, "is not A:B"),
    ("export --ops weird -o {w}/out/x.onnx", 2, "Invalid value"),
    ("export --batch 1 -o {w}/out/x.onnx", 2, "Invalid value"),
    ("export --opset 99 -o {w}/out/x.onnx", 2, "Invalid value"),
    ("export --stages 2 -o {w}/out/st", 2, "Hugging Face"),
    ("export --prefill-chunk 8 -o {w}/out/x.onnx", 2, "applies to stage exports of paged graphs"),
    ("export --gpu-memory 80GiB -o {w}/out/x.onnx", 2, "--stages only"),
    ("export -o {w}/out/x.onnx --json-out /sys/r.json", 1, "cannot be written"),
    ("export", 2, "Missing option"),
    # calibrate
    ("calibrate {w}/missing.onnx -o {w}/out/q.onnx --data builtin", 1, "does not exist"),
    ("calibrate {w}/garbage.onnx -o {w}/out/q.onnx --data builtin", 1, "not a readable ONNX file"),
    ("calibrate {w}/folder.onnx -o {w}/out/q.onnx --data builtin", 2, "is a directory"),
    ("calibrate {w}/model.onnx -o {w}/model.onnx --data builtin", 2, "must all differ"),
    ("calibrate {w}/model.onnx -o /sys/q.onnx --data builtin", 1, "cannot be written"),
    ("calibrate {w}/model.onnx -o {w}/out/q.onnx", 2, "calibration data"),
    ("calibrate {w}/model.onnx -o {w}/out/q.onnx --data {w}/nothing", 1, "does not exist"),
    ("calibrate {w}/model.onnx -o {w}/out/q.onnx --data builtin --precision fp8 --cache {w}/out/c.cache", 2,
     "INT8"),
    ("calibrate {w}/model.onnx -o {w}/out/q.onnx --data builtin --report /sys/r.json", 1, "cannot be written"),
    ("calibrate {w}/model.onnx -o {w}/out/q.onnx --data builtin --cache {w}/out/c.cache --trt-version banana", 2,
     "banana"),
    ("calibrate {w}/model.onnx -o {w}/out/q.onnx --data {w}/calib", 1, "input_ids"),
    # validate
    ("validate {w}/missing.onnx", 1, "does not exist"),
    ("validate {w}/garbage.onnx", 1, "not a readable ONNX file"),
    ("validate {w}/empty.onnx", 1, "empty.onnx"),
    ("validate {w}/notes.txt", 1, "not a readable ONNX file"),
    ("validate {w}/folder.onnx", 1, "is a folder"),
    ("validate {w}/model.onnx --seq-lens 8,x", 2, "comma-separated"),
    ("validate {w}/model.onnx --seq-lens 0", 2, "integers >= 1"),
    ("validate {w}/model.onnx --seq-lens 20000000", 1, "needs about"),
    ("validate {w}/model.onnx --batch 0", 2, "Invalid value"),
    ("validate {w}/model.onnx --atol -1", 2, "Invalid value"),
    ("validate {w}/planted.onnx", 1, "runs no code that a file names"),
    ("validate {w}/legacy_planted.onnx", 1, "runs no code that a file names"),
    ("validate {w}/model.onnx --reference {w}/missing.py:make", 1, "does not exist"),
    ("validate {w}/model.onnx --reference no-such-model", 1, "neither a built-in model"),
    ("validate {w}/model.onnx --json-out /sys/r.json", 1, "cannot be written"),
    ("validate {b}/model_flip/model.onnx", 1, "model.onnx' does not match the sha256"),
    # inspect
    ("inspect {w}/missing.onnx", 1, "does not exist"),
    ("inspect {w}/garbage.onnx", 1, "not a readable ONNX file"),
    ("inspect {w}/folder.onnx", 1, "is a folder"),
    ("inspect {w}/model.onnx --json-out {w}/folder.onnx", 2, "is a directory"),
    # build
    ("build -o {w}/blocker", 2, "is a file"),
    ("build {w}/model.onnx -o /sys/dsa-export-build", 1, "cannot be written"),
    ("build {w}/model.onnx -o {w}/blocker/b", 1, "is a file, not a folder"),
    ("build {w}/model.onnx -o {w}/out/b --max-shapes sequence", 2, "name=size"),
    ("build {w}/model.onnx -o {w}/out/b --max-shapes foo=3", 2, "not a dynamic dim"),
    ("build {w}/model.onnx -o {w}/out/b --min-shapes sequence=600", 2, "min <= opt <= max"),
    ("build {w}/model.onnx -o {w}/out/b --backend tensorrt-rtx --rtx-target SM12", 2, "SM12"),
    ("build {w}/model.onnx -o {w}/out/b --rtx-target banana", 2, "compute capability name"),
    ("build {w}/model.onnx -o {w}/out/b --backend onnxruntime --rtx-target SM89", 2, "applies to TensorRT-RTX"),
    ("build {w}/model.onnx -o {w}/out/b --plugins {w}/missing.so", 2, "does not exist"),
    ("build {w}/model.onnx -o {w}/out/b --plugins {w}/not_elf.so", 1, "not a shared library"),
    ("build {w}/model.onnx -o {w}/out/b --timing-cache {w}/folder.onnx", 2, "is a directory"),
    ("build {w}/model.onnx -o {w}/out/b --json-out /sys/r.json", 1, "cannot be written"),
    ("build {w}/garbage.onnx -o {w}/out/b", 1, "not a readable ONNX file"),
    ("build {w}/missing.onnx -o {w}/out/b", 1, "does not exist"),
    ("build {w}/folder.onnx -o {w}/out/b", 1, "is a folder"),
    ("build {w}/model.onnx -o {w}/foreign", 1, "holds no previous build"),
    ("build {w}/factories.py:raising -o {w}/out/b", 1, "raised RuntimeError"),
    ("build {w}/model.onnx -o {w}/out/b --precision int8 --calibration-data {w}/nothing", 1, "does not exist"),
    ("build {b}/model_flip/model.onnx -o {w}/out/b", 1, "does not match the sha256"),
    # run
    ("run {w}/nothing", 1, "does not exist"),
    ("run", 2, "Missing argument"),
    ("run {b}/intact --dims foo=3", 2, "foo"),
    ("run {b}/intact --dims sequence=0", 2, "sizes >= 1"),
    ("run {b}/intact --dims sequence=100000", 1, "outside the optimization profile of the build"),
    ("run {w}/model.onnx --dims batch=1,sequence=20000000", 1, "needs about"),
    ("run {b}/intact --inputs {w}/float_ids.npz", 1, "is float32"),
    ("run {b}/intact --inputs {w}/big_ids.npz", 1, "token ids must be below"),
    ("run {b}/intact --inputs {w}/negative_ids.npz", 1, "outside the range"),
    ("run {b}/intact --inputs {w}/wrong_name.npz", 1, "unknown input"),
    ("run {b}/intact --inputs {w}/wrong_rank.npz", 1, "has 3 dims"),
    ("run {b}/intact --inputs {w}/one_array.npy", 1, "one array"),
    ("run {b}/intact --inputs {w}/garbage.npz", 1, "not a readable .npz"),
    ("run {b}/intact --inputs {w}/folder.onnx", 2, "is a directory"),
    ("run {b}/intact --inputs {w}/float_ids.npz --dims batch=1", 2, "drop it"),
    ("run {b}/intact --outputs /sys/o.npz", 1, "cannot be written"),
    ("run {b}/intact --outputs {w}/folder.onnx", 2, "is a directory"),
    ("run {b}/intact --outputs {w}/blocker/o.npz", 1, "is a file, not a folder"),
    ("run {b}/intact --outputs {w}/out/o.npz --save-inputs {w}/out/o.npz", 2, "is also"),
    ("run {w}/model.onnx --runtime engine", 2, "not an engine"),
    ("run {b}/intact/model.plan --runtime onnxruntime", 2, "is an engine"),
    ("run {b}/intact --runtime engine", 1, "model.plan"),
    ("run {b}/engine_flip", 1, "model.plan' does not match the sha256"),
    ("run {b}/engine_flip/model.plan", 1, "model.plan' does not match the sha256"),
    ("run {b}/engine_truncated", 1, "model.plan' is 1000 bytes"),
    ("run {b}/engine_missing", 1, "model.plan' is missing"),
    ("run {b}/onnx_flip --runtime onnxruntime", 1, "model.optimized.onnx' does not match"),
    ("run {b}/onnx_truncated --runtime onnxruntime", 1, "model.optimized.onnx' is 1 bytes"),
    ("run {b}/model_flip/model.onnx", 1, "model.onnx' does not match"),
    ("run {b}/external_flip --runtime onnxruntime", 1, "model.optimized.onnx.data' does not match"),
    ("run {b}/external_truncated --runtime onnxruntime", 1, "model.optimized.onnx.data' is 10 bytes"),
    ("run {b}/engine_escape", 1, "leads out of the folder"),
    ("run {b}/engine_absolute", 1, "absolute path"),
    ("run {b}/bad_dtype", 1, "invalid field inputs[0].dtype"),
    ("run {b}/bad_profile", 1, "invalid field profiles.dims.sequence"),
    ("run {b}/bad_files", 1, "invalid field files"),
    ("run {b}/manifest_garbage", 1, "not valid JSON"),
    ("run {b}/manifest_list", 1, "not a dsa-export manifest"),
    ("run {b}/session_escape --runtime onnxruntime", 1, "session.json' is"),
    ("run {b}/session_escape --runtime onnxruntime --no-verify", 1, "leads out of the folder"),
    ("run {b}/session_option --runtime onnxruntime --no-verify", 1, "optimized_model_filepath"),
    ("run {b}/session_plugin --runtime onnxruntime --no-verify", 1, "trt_engine_decryption_lib_path"),
    ("run {b}/session_garbage --runtime onnxruntime --no-verify", 1, "not readable JSON"),
    # build as stages
    ("build {w}/foreign --stages 2 -o {w}/out/st", 1, "neither a Hugging Face checkpoint"),
    ("build {w}/model.onnx --gpus 2 -o {w}/out/b", 2, "apply to stage builds"),
    ("build {w}/model.onnx --prefill-chunk 8 -o {w}/out/b", 2, "applies to stage builds of paged graphs"),
    ("build {w}/foreign --stages x -o {w}/out/st", 2, "neither auto nor a stage count"),
    # generate
    ("generate {w}/model.onnx", 2, "--prompt TEXT, --prompt-file FILE or --input-ids"),
    ("generate {w}/model.onnx --input-ids {w}/one_array.npy", 1, "not a decode graph"),
    ("generate {w}/model.onnx --prompt hi", 2, "records no Hugging Face checkpoint"),
    ("generate {w}/model.onnx --input-ids {w}/notes.txt", 1, "cannot read token ids"),
    ("generate {w}/model.onnx --input-ids {w}/wrong_name.npz", 1, "is an .npz archive"),
    ("generate {w}/model.onnx --input-ids {w}/one_array.npy --ray auto", 2, "--ray runs pipeline stages"),
    ("generate {w}/model.onnx --input-ids {w}/one_array.npy --top-p 0.5", 2, "add --temperature"),
    ("generate {w}/model.onnx --input-ids {w}/one_array.npy --max-new-tokens 0", 2, "Invalid value"),
    ("generate {w}/model.onnx --input-ids {w}/one_array.npy --json-out /sys/g.json", 1, "cannot be written"),
    ("generate {w}/nothing --input-ids {w}/one_array.npy", 2, "does not exist"),
    # serve
    ("serve {w}/model.onnx", 2, "records no Hugging Face checkpoint"),
    ("serve {w}/model.onnx --tokenizer {w}/notes.txt", 1, "cannot load the tokenizer"),
    ("serve {w}/model.onnx --api-key=", 2, "--api-key is empty"),
    ("serve {w}/model.onnx --port 70000", 2, "Invalid value"),
    ("serve {w}/model.onnx --max-batch 0", 2, "Invalid value"),
    ("serve {w}/nothing", 2, "does not exist"),
    # check, plugins, bench, the command line itself
    ("check --engine {w}/missing.plan", 1, "does not exist"),
    ("check --engine {w}/notes.txt", 1, "text file"),
    ("check --timeout 0", 2, "Invalid value"),
    ("plugins build --build-dir /sys/dsa-export-plugins", 1, "cannot be written"),
    ("plugins build --build-dir {w}/blocker", 2, "is a file"),
    ("plugins build --cuda-arch banana", 2, "banana"),
    ("plugins path --kind bogus", 2, "Invalid value"),
    ("bench --seq 1", 2, "at least 2"),
    ("bench --plot {w}/out/plot.txt", 2, ".png"),
    ("bench --json-out /sys/b.json", 1, "cannot be written"),
    ("bench --backends bogus", 2, "no known backend"),
    ("bench --topk 0", 2, "Invalid value"),
    ("bench --case moe --seq 64", 2, "belongs to --case attention"),
    ("bench --json {w}/out/b.json --json-out {w}/out/c.json", 2, "both name a file"),
    ("frobnicate", 2, "No such command"),
    ("export --frobnicate", 2, "No such option"),
    ("run {b}/intact --debugging", 2, "No such option"),
]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` (hidden ones too) with its size and modification time."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            stat = path.lstat()
            state[str(path.relative_to(root))] = (stat.st_size if path.is_file() else -1, stat.st_mtime_ns)
    return state


@pytest.fixture(scope="module")
def fast_probe():
    """The environment, probed once: it is not an input, and each probe costs seconds."""
    from dsa_export.compat import probe_environment

    return probe_environment()


@pytest.mark.parametrize("argv,code,message", CASES, ids=[c[0][:60] for c in CASES])
def test_bad_input(bad_world, fast_probe, capsys, monkeypatch, tmp_path, argv, code, message):
    from dsa_export.cli.main import main

    monkeypatch.setattr("dsa_export.compat.probe_environment", lambda *a, **k: fast_probe)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    words = [part.format(w=bad_world, b=bad_world / "builds") for part in argv.split()]
    if any("model.plan" in w for w in words) or "engine" in argv:
        if not (bad_world / "builds" / "intact" / "model.plan").is_file():
            pytest.skip("the demo build has no engine here (TensorRT-RTX is not installed)")
    before = _snapshot(bad_world)
    with pytest.raises(SystemExit) as exit_info:
        main(words)
    out, err = capsys.readouterr()
    assert exit_info.value.code == code, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert message in lines[0], err
    assert "Traceback" not in err and "Internal error" not in err
    assert _snapshot(bad_world) == before  # no partial output, no input touched
    assert not (bad_world / MARKER).exists()


def test_the_list_covers_every_command():
    from dsa_export.cli.main import SUBCOMMANDS

    assert len(CASES) >= 60
    assert {c[0].split()[0] for c in CASES} >= set(SUBCOMMANDS)
