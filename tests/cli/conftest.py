"""A folder of bad inputs for every command, made once per module that asks for it.

``bad_world`` holds the pieces the bad-input list points at: unreadable and misnamed files, inputs
of the wrong type or range, a planted payload that a file names as its reference, and copies of
the demo build damaged one way each (a flipped byte, a truncation, a path out of the folder, a
field of the wrong type, an option that would load code).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

#: The planted payload writes this file when it runs; no command may make it run.
MARKER = "PAYLOAD_RAN"

PAYLOAD = f'''
from pathlib import Path
Path(__file__).with_name("{MARKER}").write_text("ran")

def make(batch=2, seq_len=8):
    Path(__file__).with_name("{MARKER}").write_text("called")
    raise RuntimeError("payload")
'''

FACTORIES = '''
import torch


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
            return x * 2
        return x


class PlusOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


def branchy(batch=2, seq_len=8):
    return Branchy(), (torch.randn(batch, seq_len, 4),), ["y"]


def same_name(batch=2, seq_len=8):
    return PlusOne(), {"x": torch.randn(batch, seq_len, 4)}, ["x"]


def raising(batch=2, seq_len=8):
    raise RuntimeError("boom")


def not_a_module():
    return 3, torch.zeros(1)
'''


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _with_reference(source: Path, target: Path, reference: dict | str) -> None:
    """A copy of ``source`` whose recorded reference is ``reference`` (a JSON record, or the spec
    string files of dsa-export 0.1 recorded)."""
    import onnx

    model = onnx.load(str(source))
    for prop in model.metadata_props:
        if prop.key == "dsa_export.reference":
            prop.value = reference if isinstance(reference, str) else json.dumps(reference)
    onnx.save(model, str(target))


def _external_data_copy(build: Path) -> None:
    """Turn the build's optimized ONNX into one with external data, recorded in the manifest."""
    import onnx

    from dsa_export.fileio import file_record

    optimized = build / "onnxruntime" / "model.optimized.onnx"
    model = onnx.load(str(optimized))
    onnx.save(model, str(optimized), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.optimized.onnx.data", size_threshold=0)

    def edit(data):
        for name in ("onnxruntime/model.optimized.onnx", "onnxruntime/model.optimized.onnx.data"):
            data["files"][name] = file_record(build / name)

    _edit_json(build / "manifest.json", edit)


@pytest.fixture(scope="module")
def bad_world(tmp_path_factory, exported, demo_build):
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "garbage.onnx").write_bytes(b"\x00\xffnot onnx at all" * 10)
    (root / "empty.onnx").write_bytes(b"")
    (root / "notes.txt").write_text("hello\n")
    (root / "folder.onnx").mkdir()
    (root / "folder.py").mkdir()
    (root / "blocker").write_text("a file where a folder is expected\n")
    (root / "foreign").mkdir()
    (root / "foreign" / "keep.txt").write_text("not a build\n")
    (root / "not_elf.so").write_text("not a library\n")
    (root / "payload.py").write_text(PAYLOAD)
    (root / "factories.py").write_text(FACTORIES)
    shutil.copy(exported["plugin"], root / "model.onnx")
    _with_reference(exported["plugin"], root / "planted.onnx",
                    {"version": 1, "kind": "factory", "name": "make", "path": "payload.py", "relative": True})
    _with_reference(exported["plugin"], root / "legacy_planted.onnx", f"{root / 'payload.py'}:make")
    np.savez(root / "float_ids.npz", input_ids=np.zeros((1, 8), np.float32))
    np.savez(root / "big_ids.npz", input_ids=np.full((1, 8), 100_000, np.int64))
    np.savez(root / "negative_ids.npz", input_ids=np.full((1, 8), -3, np.int64))
    np.savez(root / "wrong_name.npz", tokens=np.zeros((1, 8), np.int64))
    np.savez(root / "wrong_rank.npz", input_ids=np.zeros((1, 8, 2), np.int64))
    np.save(root / "one_array.npy", np.zeros((1, 8), np.int64))
    (root / "garbage.npz").write_bytes(b"PK\x03\x04 broken zip")
    (root / "calib").mkdir()
    np.savez(root / "calib" / "float.npz", input_ids=np.zeros((1, 8), np.float32))

    build = demo_build[0].output
    variants = {
        "intact": None,
        "engine_flip": lambda b: _flip_byte(b / "model.plan", 4096),
        "engine_truncated": lambda b: (b / "model.plan").write_bytes((b / "model.plan").read_bytes()[:1000]),
        "onnx_flip": lambda b: _flip_byte(b / "onnxruntime" / "model.optimized.onnx", 200),
        "onnx_truncated": lambda b: (b / "onnxruntime" / "model.optimized.onnx").write_bytes(b"\x08"),
        "model_flip": lambda b: _flip_byte(b / "model.onnx", 300),
        "engine_missing": lambda b: (b / "model.plan").unlink(),
        "engine_escape": lambda b: _edit_json(b / "manifest.json", lambda d: d["engine"].update(file="../../model.plan")),
        "engine_absolute": lambda b: _edit_json(b / "manifest.json", lambda d: d["engine"].update(file="/etc/hostname")),
        "bad_dtype": lambda b: _edit_json(b / "manifest.json", lambda d: d["inputs"][0].update(dtype="floop")),
        "bad_profile": lambda b: _edit_json(b / "manifest.json", lambda d: d["profiles"]["dims"].update(sequence=[9, 1])),
        "bad_files": lambda b: _edit_json(b / "manifest.json", lambda d: d.update(files=["model.onnx"])),
        "manifest_garbage": lambda b: (b / "manifest.json").write_text("{not json"),
        "manifest_list": lambda b: (b / "manifest.json").write_text("[1, 2]"),
        "session_escape": lambda b: _edit_json(
            b / "onnxruntime" / "session.json", lambda d: [c.update(model="../../model.onnx") for c in d["chains"]]),
        "session_option": lambda b: _edit_json(
            b / "onnxruntime" / "session.json",
            lambda d: d["session_options"].update(optimized_model_filepath="/tmp/dsa-export-planted.onnx")),
        "session_plugin": lambda b: _edit_json(
            b / "onnxruntime" / "session.json",
            lambda d: d["chains"][2]["providers"][0][1].update(trt_engine_decryption_lib_path="/tmp/evil.so")),
        "session_garbage": lambda b: (b / "onnxruntime" / "session.json").write_text("{broken"),
        "external_flip": lambda b: (_external_data_copy(b),
                                    _flip_byte(b / "onnxruntime" / "model.optimized.onnx.data", 64)),
        "external_truncated": lambda b: (_external_data_copy(b), (b / "onnxruntime" / "model.optimized.onnx.data")
                                         .write_bytes(b"\x00" * 10)),
    }
    for name, damage in variants.items():
        shutil.copytree(build, root / "builds" / name)
        (root / "builds" / name / ".verified.json").unlink(missing_ok=True)  # make every copy hash its files
        if damage is not None:
            damage(root / "builds" / name)
    return root
