"""A checkpoint folder is untrusted input: every field of its shard index and of its safetensors
headers is checked before it is used, by both ``dsa-export plan`` and ``dsa-export export``.

Each case below damages one copy of a tiny checkpoint one way (a shard name leaving the folder, a
weight_map of the wrong type, a header whose byte ranges overlap, a transposed 2-D weight, ...)
and both commands must refuse it the house way (tests/cli/test_bad_inputs.py): exit 1, one
sentence on stderr, no traceback, no output file, the inputs untouched. Files planted outside the
folder are valid safetensors holding a tensor the model needs, so reading them would succeed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from dsa_export.errors import DSAUserError
from dsa_export.hf.checkpoint import INDEX_NAME, SafetensorsCheckpoint, read_header
from dsa_export.hf.safetensors_header import parse_header

SHARD = "model.safetensors"
WEIGHT = "model.layers.0.self_attn.q_a_proj.weight"  # [q_lora 48, hidden 64]: 2-D, not square
NORM = "model.layers.0.input_layernorm.weight"  # [64]


def read_shard(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_shard(path: Path, header, data: bytes, *, raw_header: bytes | None = None) -> None:
    """``header`` (any JSON, or ``raw_header`` bytes) padded to 8 bytes as safetensors does, then ``data``."""
    raw = raw_header if raw_header is not None else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.unlink(missing_ok=True)  # never write through a link
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def edit_header(edit):
    """A damage that rewrites the shard's header with ``edit(header, data)`` (returning new data or None)."""
    def damage(folder: Path, outside: Path) -> None:
        header, data = read_shard(folder / SHARD)
        new = edit(header, data)
        write_shard(folder / SHARD, header, data if new is None else new)
    return damage


def with_index(weight_map_of):
    """A damage that adds an index whose weight_map is ``weight_map_of(keys, folder, outside)``."""
    def damage(folder: Path, outside: Path) -> None:
        keys = [k for k in read_shard(folder / SHARD)[0] if k != "__metadata__"]
        (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map_of(keys, folder, outside)}))
    return damage


def _pointing(name_of):
    """Every key in the model's shard, but WEIGHT's shard named ``name_of(folder, outside)``."""
    return with_index(lambda keys, folder, outside: {k: name_of(folder, outside) if k == WEIGHT else SHARD for k in keys})


def _link(folder: Path, outside: Path) -> str:
    (folder / "linked.safetensors").symlink_to(outside)
    return "linked.safetensors"


def _stray_link(folder: Path, outside: Path) -> None:
    (folder / "extra.safetensors").symlink_to(outside)


def _raw_index(text: str):
    def damage(folder: Path, outside: Path) -> None:
        (folder / INDEX_NAME).write_text(text)
    return damage


def _transpose(header, data):
    header[WEIGHT]["shape"] = header[WEIGHT]["shape"][::-1]


def _overlap(header, data):
    begin, end = header[NORM]["data_offsets"]
    header[NORM]["data_offsets"] = [0, end - begin]  # on top of the first tensor


def _hole(header, data):
    # Drop the tensor that sits first in the file: bytes 0:n then belong to no tensor.
    first = min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    del header[first]


def _negative(header, data):
    header[NORM]["shape"] = [-64]


def _dtype(header, data):
    header[NORM]["dtype"] = "Q7"


def _past_the_file(header, data):
    header["model.extra"] = {"dtype": "F32", "shape": [4], "data_offsets": [len(data), len(data) + 16]}


def _size(header, data):
    header[NORM]["shape"] = [63]  # 63 * 4 bytes in a 256-byte range


def _huge(header, data):
    header[NORM]["shape"] = [1 << 41, 0]  # no bytes, but a dimension no tensor has


def _bigger_than_file(header, data):
    # A tensor of 2**42 bytes whose size agrees with its shape: refused by arithmetic, never allocated.
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    header["model.huge"] = {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [end, end + (1 << 42)]}


def _trailing(header, data):
    return data + b"\x00" * 64


def _float_offsets(header, data):
    header[NORM]["data_offsets"] = [float(v) for v in header[NORM]["data_offsets"]]


def _metadata(header, data):
    header["__metadata__"] = {"format": 3}


def _raw_header(raw: bytes):
    def damage(folder: Path, outside: Path) -> None:
        _, data = read_shard(folder / SHARD)
        write_shard(folder / SHARD, None, data, raw_header=raw)
    return damage


def _duplicate_key(folder: Path, outside: Path) -> None:
    header, data = read_shard(folder / SHARD)
    raw = json.dumps(header).encode()
    entry = json.dumps({NORM: header[NORM]})[1:-1].encode()
    write_shard(folder / SHARD, None, data, raw_header=raw[:-1] + b", " + entry + b"}")


def _header_length(folder: Path, outside: Path) -> None:
    raw = (folder / SHARD).read_bytes()
    (folder / SHARD).write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])


def _duplicate_shard(folder: Path, outside: Path) -> None:
    shutil.copy(folder / SHARD, folder / "model-copy.safetensors")


# (case, damage, part of plan's message, part of export's message)
CASES = [
    # the shard index
    ("index-dotdot", _pointing(lambda f, o: "../outside.safetensors"), "leads out of the checkpoint folder", None),
    ("index-dotdot-inner", _pointing(lambda f, o: "sub/../../outside.safetensors"), "leads out of the checkpoint", None),
    ("index-absolute", _pointing(lambda f, o: "/etc/passwd"), "absolute path '/etc/passwd'", None),
    ("index-absolute-shard", _pointing(lambda f, o: str(o)), "is the absolute path", None),
    ("index-symlink", _pointing(_link), "outside the checkpoint folder", None),
    ("index-not-safetensors", _pointing(lambda f, o: "config.json"), "not a .safetensors file", None),
    ("index-empty-name", _pointing(lambda f, o: ""), "not a file name", None),
    ("index-list", with_index(lambda keys, f, o: [[k, SHARD] for k in keys]), "field weight_map of", None),
    ("index-non-string", with_index(lambda keys, f, o: {**{k: SHARD for k in keys}, WEIGHT: 3}),
     f"field weight_map['{WEIGHT}']", None),
    ("index-empty", with_index(lambda keys, f, o: {}), "is empty", None),
    ("index-not-object", _raw_index("[1, 2]"), "not an object with a weight_map", None),
    ("index-no-weight-map", _raw_index('{"metadata": {}}'), "has no field weight_map", None),
    ("index-not-json", _raw_index("{not json"), "is not valid JSON", None),
    ("glob-symlink", _stray_link, "outside the checkpoint folder", None),
    ("two-shards-one-key", _duplicate_shard, "is in both", None),
    # the safetensors header
    ("header-overlap", edit_header(_overlap), "overlaps the tensor before it", None),
    ("header-hole", edit_header(_hole), "belong to no tensor", None),
    ("header-negative-dim", edit_header(_negative), "negative dimension", None),
    ("header-unknown-dtype", edit_header(_dtype), "has dtype 'Q7'", None),
    ("header-past-the-file", edit_header(_past_the_file), "interrupted download", None),
    ("header-size-mismatch", edit_header(_size), "needs 252", None),
    ("header-huge-dim", edit_header(_huge), "implausible dimension", None),
    ("header-bigger-than-file", edit_header(_bigger_than_file), "interrupted download", None),
    ("header-trailing-bytes", edit_header(_trailing), "after its last tensor", None),
    ("header-float-offsets", edit_header(_float_offsets), "not two integers", None),
    ("header-metadata", edit_header(_metadata), "__metadata__ is not an object of strings", None),
    ("header-list", _raw_header(b"[1, 2]"), "not an object", None),
    ("header-not-json", _raw_header(b"{garbage"), "the header is not JSON", None),
    ("header-not-utf8", _raw_header(b'{"\xff": 1}'), "not UTF-8", None),
    ("header-duplicate-key", _duplicate_key, "twice", None),
    ("header-length", _header_length, "implausible", None),
    # a lie only config.json can expose: same element count, transposed
    ("header-transposed", edit_header(_transpose), "config.json implies [48, 64]", "stored transposed"),
]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            stat = (Path(dirpath) / name).lstat()
            state[str(Path(dirpath, name).relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return state


@pytest.fixture(scope="module")
def bad_checkpoints(checkpoints, tmp_path_factory):
    """One damaged copy of the tiny DeepSeek-V3.2 checkpoint per case, next to a planted valid shard."""
    source = checkpoints["deepseek_v32"]
    root = tmp_path_factory.mktemp("untrusted")
    header, data = read_shard(source / SHARD)
    # A valid safetensors file outside every folder, holding the very tensor the index redirects.
    outside = root / "outside.safetensors"
    begin, end = header[WEIGHT]["data_offsets"]
    write_planted = {WEIGHT: {**header[WEIGHT], "data_offsets": [0, end - begin]}}
    write_shard(outside, write_planted, data[begin:end])
    folders = {}
    for name, damage, _, _ in CASES:
        folder = root / "cases" / name
        shutil.copytree(source, folder)
        damage(folder, outside)
        folders[name] = folder
    return root, folders


@pytest.fixture(scope="module")
def fast_probe():
    from dsa_export.compat import probe_environment

    return probe_environment()


def _run(argv: list[str], capsys) -> tuple[int, str]:
    from dsa_export.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, err


@pytest.mark.parametrize("command", ["plan", "export"])
@pytest.mark.parametrize("name,plan_message,export_message", [(c[0], c[2], c[3]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_refused_cleanly(bad_checkpoints, fast_probe, capsys, monkeypatch, tmp_path, command, name, plan_message,
                         export_message):
    root, folders = bad_checkpoints
    folder = folders[name]
    monkeypatch.setattr("dsa_export.compat.probe_environment", lambda *a, **k: fast_probe)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = (["plan", str(folder), "--gpu-memory", "141GiB"] if command == "plan"
            else ["export", str(folder), "-o", str(out / "out.onnx")])
    before = _snapshot(root)
    code, err = _run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err and "Internal error" not in err
    message = export_message if command == "export" and export_message else plan_message
    assert message in lines[0], err
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())
    assert _snapshot(root) == before


def test_good_checkpoint_still_plans(checkpoints, capsys):
    code, err = _run(["plan", str(checkpoints["deepseek_v32"]), "--gpu-memory", "141GiB"], capsys)
    assert code in (0, None), err


def test_a_good_index_and_inner_dotdot_are_read(checkpoints, tmp_path):
    folder = tmp_path / "ok"
    shutil.copytree(checkpoints["deepseek_v32"], folder)
    (folder / "sub").mkdir()
    keys = [k for k in read_shard(folder / SHARD)[0] if k != "__metadata__"]
    weight_map = {k: "sub/../model.safetensors" if k == WEIGHT else SHARD for k in keys}
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    ckpt = SafetensorsCheckpoint(folder)
    assert ckpt.shards == [SHARD] and ckpt.info(WEIGHT).shape == (48, 64)
    from dsa_export.stages.plan import plan_stages

    assert plan_stages(folder, gpu_memory_bytes="141GiB").weights_source.startswith("safetensors headers")


def test_hugging_face_cache_snapshot_links_are_followed(checkpoints, tmp_path):
    """``snapshot_download`` folders hold links into the repo's own ``blobs``; those stay inside it."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in checkpoints["deepseek_v32"].iterdir():
        shutil.copy(file, blobs / f"blob-{file.name}")
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob-{file.name}")
    assert SafetensorsCheckpoint(snapshot).info(WEIGHT).shape == (48, 64)
    from dsa_export.stages.plan import plan_stages

    plan_stages(snapshot, gpu_memory_bytes="141GiB")
    # ... but a snapshot link to anywhere else is still refused.
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(checkpoints["deepseek_v32"] / SHARD, outside)
    (snapshot / SHARD).unlink()
    (snapshot / SHARD).symlink_to(outside)
    with pytest.raises(DSAUserError, match="outside the checkpoint folder"):
        SafetensorsCheckpoint(snapshot)


def test_transposed_fp8_block_scales_are_refused(checkpoints, tmp_path):
    """An FP8 weight's ``weight_scale_inv`` must be ceil(out/block) x ceil(in/block), kept or dequantized."""
    import torch

    from dsa_export.hf.loader import inspect_checkpoint
    from dsa_export.hf.sizes import Geometry, ImpliedShapes, shard_files, weights_from_headers
    from dsa_export.hf.weights import build_meta_model, weight_recipes

    from .conftest import make_fp8_checkpoint

    path, _ = make_fp8_checkpoint(tmp_path, checkpoints["deepseek_v32"], block=16)
    scale = "model.layers.0.self_attn.q_b_proj.weight_scale_inv"  # q_b_proj [96, 48]: scales [6, 3]
    header, data = read_shard(path / SHARD)
    assert header[scale]["shape"] == [6, 3]
    config = inspect_checkpoint(path).config
    assert ImpliedShapes(Geometry.from_config(config)).get(scale) == (6, 3)
    header[scale]["shape"] = [3, 6]
    write_shard(path / SHARD, header, data)
    with pytest.raises(DSAUserError, match=r"config.json implies \[6, 3\]"):
        weights_from_headers(Geometry.from_config(config), shard_files(path)[0], None)
    checkpoint = SafetensorsCheckpoint(path)
    for mode in ("keep", "dequantize"):  # the kept scale parameter, or the scales of the dequantized weight
        with pytest.raises(DSAUserError, match=r"has shape \[3, 6\] \(.*transposed\).*needs \[6, 3\]"):
            build_meta_model(config, checkpoint, dtype=torch.float32, fp8=mode)
    # The lazy path (one parameter at a time, as the exporter asks) checks the same.
    (tmp_path / "intact").mkdir()
    intact = SafetensorsCheckpoint(make_fp8_checkpoint(tmp_path / "intact", checkpoints["deepseek_v32"], block=16)[0])
    model = build_meta_model(config, intact, dtype=torch.float32, fp8="dequantize")
    with pytest.raises(DSAUserError, match=r"FP8 block scales of 'model.layers.0.self_attn.q_b_proj.weight'"):
        weight_recipes(model, checkpoint, ["model.layers.0.self_attn.q_b_proj.weight"], block_size=16)


def test_transposed_expert_weight_is_refused(checkpoints, tmp_path):
    """Expert tensors are checked one by one against their share of the stacked parameter."""
    import torch

    from dsa_export.hf.loader import inspect_checkpoint
    from dsa_export.hf.weights import build_meta_model, weight_recipes

    folder = tmp_path / "experts"
    shutil.copytree(checkpoints["deepseek_v32"], folder)
    key = "model.layers.1.mlp.experts.2.up_proj.weight"  # [moe_intermediate 32, hidden 64]
    header, data = read_shard(folder / SHARD)
    header[key]["shape"] = header[key]["shape"][::-1]
    write_shard(folder / SHARD, header, data)
    config = inspect_checkpoint(folder).config
    message = rf"'{key}' has shape \[64, 32\] .*each expert's part of .*needs \[32, 64\]"
    with pytest.raises(DSAUserError, match=message):
        build_meta_model(config, SafetensorsCheckpoint(folder), dtype=torch.float32)
    model = build_meta_model(config, SafetensorsCheckpoint(checkpoints["deepseek_v32"]), dtype=torch.float32)
    stacked = [n for n, _ in model.named_parameters() if n.startswith("model.layers.1.mlp.experts.")]
    with pytest.raises(DSAUserError, match=message):
        weight_recipes(model, SafetensorsCheckpoint(folder), stacked)


def test_read_header_accepts_what_safetensors_writes(checkpoints, tmp_path):
    """The library's own files, an empty one and zero-size tensors pass; the data start is right."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import torch

    header, start = read_header(checkpoints["deepseek_v32"] / SHARD)
    assert start % 8 == 0 and header["__metadata__"] == {"format": "pt"}
    file = tmp_path / "mixed.safetensors"
    safetensors_torch.save_file({"a": torch.zeros(0, 3), "b": torch.ones(2, dtype=torch.bfloat16),
                                 "c": torch.zeros((), dtype=torch.int64)}, str(file))
    header, _ = read_header(file)
    assert header["a"]["shape"] == [0, 3] and header["c"]["shape"] == []
    safetensors_torch.save_file({}, str(tmp_path / "empty.safetensors"))
    read_header(tmp_path / "empty.safetensors")


@pytest.mark.parametrize("raw,data,reason", [
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
     b'"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', 8, "overlaps"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', 8, "bytes 0:4"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', 2, "interrupted download"),
    (b'{"a": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}', 4, "not a list of integers"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', 4, "0 <= begin <= end"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}', 4, "0 <= begin <= end"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}', 4, "two integers"),
    (b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', 4, "not JSON"),
    (b'{"a": {"shape": [1], "data_offsets": [0, 4]}}', 4, "dtype 'None'"),
    (b'{"a": [1]}', 0, "not an object"),
    (b'"text"', 0, "JSON string"),
    (b'null', 0, "JSON null"),
    (b'{"a": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}}', 4, "'dtype' twice"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": []}', 4, "__metadata__"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, ' + b"9" * 5000 + b']}}', 4, "not JSON"),
    (b'{"a": {"dtype": "F32", "shape": [' + b"1, " * 100000 + b'2], "data_offsets": [0, 4]}}', 4, "100001 dims"),
    (b'{"a": {"dtype": "F32", "shape": [1099511627776, 1099511627776, 1099511627776], '
     b'"data_offsets": [0, 4]}}', 4, "overflows"),
])
def test_parse_header_rules(raw, data, reason):
    with pytest.raises(ValueError, match=reason):
        parse_header(raw, data)
