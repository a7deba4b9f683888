"""EngineSession in a process that opens several engines: devices, optimization profiles, plugin loading.

Test doubles of torch (tests/runtime/test_engine_session.py) and of TensorRT (tests/trt/fakes.py,
plus a runtime engine here) record the CUDA device that is current at each TensorRT call, the
optimization profile selected, and the plugin libraries loaded.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dsa_export.compat.engine_gate import EngineRequirements
from dsa_export.errors import DSAUserError
from dsa_export.manifest import Manifest
from tests.runtime.test_engine_session import CurrentDevice, fake_torch
from tests.trt.fakes import fake_tensorrt

PREFILL = {"batch": [1, 1, 2], "sequence": [1, 8, 32], "past_sequence": [0, 0, 0]}
DECODE = {"batch": [1, 1, 2], "sequence": [1, 1, 1], "past_sequence": [0, 16, 64]}
MANIFEST = {
    "schema_version": 1,
    "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"], "value_range": [0, 10]},
               {"name": "past", "dtype": "float32", "shape": ["batch", "past_sequence", 4]}],
    "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", 4]}],
    "profiles": {"dims": PREFILL, "all": [PREFILL, DECODE]},
}


def runtime_trt(records: list, profiles: int = 2, address_ok: bool = True, switch_raises: bool = False):
    """The fake TensorRT of tests/trt/fakes.py with a runtime whose calls record the current device."""
    trt = fake_tensorrt("10.15.1")

    class Logger:
        WARNING = 2

        def __init__(self, severity):
            pass

    trt.Logger = Logger
    trt.TensorIOMode = types.SimpleNamespace(INPUT="in", OUTPUT="out")
    shapes: dict = {}

    class Context:
        def set_optimization_profile_async(self, index, stream):
            records.append(("profile", index, stream, CurrentDevice.current))
            if switch_raises:
                raise RuntimeError("Error in set optimization profile async.")
            return True

        def set_input_shape(self, name, shape):
            shapes[name] = shape
            return True

        def set_tensor_address(self, name, address):
            return address_ok

        def get_tensor_shape(self, name):
            batch, seq = shapes["input_ids"]
            return (batch, seq, 4)

        def execute_async_v3(self, stream):
            records.append(("execute", CurrentDevice.current))
            return True

    class Engine:
        num_io_tensors = 3
        num_optimization_profiles = profiles

        def get_tensor_name(self, i):
            return ["input_ids", "past", "logits"][i]

        def get_tensor_mode(self, name):
            return "out" if name == "logits" else "in"

        def get_tensor_dtype(self, name):
            return types.SimpleNamespace(name="INT64" if name == "input_ids" else "FLOAT")

        def create_execution_context(self):
            records.append(("context", CurrentDevice.current))
            return Context()

    class Runtime:
        def __init__(self, logger):
            records.append(("runtime", CurrentDevice.current))
            self.engine_host_code_allowed = False

        def deserialize_cuda_engine(self, data):
            records.append(("deserialize", CurrentDevice.current, self.engine_host_code_allowed))
            return Engine()

    trt.Runtime = Runtime
    return trt


@pytest.fixture
def opened(tmp_path, monkeypatch):
    """``open(requirements, **runtime_trt options) -> (session, trt, records, torch)`` over the doubles."""
    import dsa_export.compat

    plugin = tmp_path / "libdsa_plugins.so"
    plugin.write_bytes(b"\x7fELF")
    monkeypatch.setenv("DSA_EXPORT_PLUGIN_LIB", str(plugin))
    engine_file = tmp_path / "model.plan"
    engine_file.write_bytes(b"ftrt-plan")
    manifest = Manifest(MANIFEST, tmp_path / "manifest.json")
    torch = fake_torch()
    torch.cuda.is_available = lambda: True
    monkeypatch.setitem(sys.modules, "torch", torch)

    def open_engine(requirements: EngineRequirements, trt=None, device: int = 1, **options):
        from dsa_export.runtime.tensorrt import EngineSession

        records: list = []
        trt = trt or runtime_trt(records, **options)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setattr(dsa_export.compat, "gate_engine", lambda path, probe=None, device=0, manifest_data=None: requirements)
        return EngineSession.open(engine_file, manifest, device=device), trt, records, torch

    return open_engine


WITH_PLUGINS = EngineRequirements(trt_version="10.15.1", plugin_library_sha256="ab" * 32)


def _feeds(sequence: int, past: int) -> dict:
    return {"input_ids": np.ones((1, sequence), dtype=np.int64), "past": np.zeros((1, past, 4), dtype=np.float32)}


def test_open_and_run_happen_on_the_sessions_device(opened):
    session, trt, records, torch = opened(WITH_PLUGINS, device=1)
    assert CurrentDevice.current is None  # restored after open
    session.run(_feeds(4, 0))
    assert ("runtime", 1) in records and ("deserialize", 1, False) in records and ("context", 1) in records
    assert ("execute", 1) in records and CurrentDevice.current is None
    assert torch.log[0] == ("stream", "cuda:1")


def test_two_engines_in_one_process_load_the_plugin_library_once(opened):
    first, trt, records, _ = opened(WITH_PLUGINS)
    second, *_ = opened(WITH_PLUGINS, trt=trt)  # the next stage of a pipeline, same TensorRT module
    assert trt.calls["plugins"] == [str(first.notes[0].removeprefix("plugin library "))]
    assert second.notes == first.notes


def test_a_plan_with_its_plugin_library_serialized_does_not_load_it_again(opened):
    serialized = EngineRequirements(trt_version="10.15.1", version_compatible=True, plugin_library_sha256="ab" * 32,
                                    plugins_serialized=True)
    session, trt, records, _ = opened(serialized)
    assert trt.calls["plugins"] == []
    assert ("deserialize", 1, True) in records  # engine host code allowed (the lean runtime, the library)
    assert "serialized in the engine" in session.notes[0]


def test_the_first_profile_holding_the_shapes_is_selected(opened):
    session, trt, records, _ = opened(WITH_PLUGINS)
    session.run(_feeds(8, 0))  # prefill: profile 0, the context's initial one
    assert not [r for r in records if r[0] == "profile"]
    session.run(_feeds(1, 10))  # decode: profile 1, selected on the session's stream
    session.run(_feeds(1, 12))
    assert [r for r in records if r[0] == "profile"] == [("profile", 1, 1234, 1)]
    session.run(_feeds(1, 0))  # in both: the first, prefill
    assert [r[1] for r in records if r[0] == "profile"] == [1, 0]


def test_shapes_outside_every_profile_name_the_profiles(opened):
    session, *_ = opened(WITH_PLUGINS)
    named = (r"fit none of the engine's 2 optimization profiles \(profile 0: batch 1\.\.2, sequence 1\.\.32, "
             r"past_sequence 0\.\.0; profile 1: .*past_sequence 0\.\.64\)")
    with pytest.raises(DSAUserError, match=named):
        session.run(_feeds(8, 10))
    with pytest.raises(DSAUserError, match="has 2 dims"):  # what no profile can change is said as before
        session.run({"input_ids": np.ones((1, 2), dtype=np.int64), "past": np.zeros((1, 2), dtype=np.float32)})


def test_a_refused_profile_switch_is_a_clear_error(opened):
    session, *_ = opened(WITH_PLUGINS, switch_raises=True)
    with pytest.raises(DSAUserError, match=r"could not switch the execution context to optimization profile 1 "
                                           r"\(Error in set optimization profile async\.\)"):
        session.run(_feeds(1, 3))


def test_a_refused_tensor_address_is_a_clear_error(opened):
    session, *_ = opened(WITH_PLUGINS, address_ok=False)
    with pytest.raises(DSAUserError, match="TensorRT refused the device address of tensor 'input_ids'"):
        session.run(_feeds(2, 0))


def test_a_manifest_that_disagrees_with_the_engine_on_profiles_is_refused(opened):
    with pytest.raises(DSAUserError, match=r"engine has 1 optimization profile\(s\) but .* records 2"):
        opened(WITH_PLUGINS, profiles=1)


def test_a_damaged_profile_list_is_refused(tmp_path):
    from dsa_export.runtime.tensorrt import manifest_profiles

    data = dict(MANIFEST, profiles={"dims": PREFILL, "all": [{"sequence": [4, 1, 8]}]})
    with pytest.raises(DSAUserError, match="invalid field profiles.all"):
        manifest_profiles(Manifest(data, tmp_path / "manifest.json"))
    old = dict(MANIFEST, profiles={"dims": PREFILL})  # written before profiles.all existed
    assert manifest_profiles(Manifest(old, tmp_path / "manifest.json")) == [{k: tuple(v) for k, v in PREFILL.items()}]


def test_gate_does_not_ask_for_a_library_the_plan_carries():
    from dsa_export.compat.engine_gate import compare_engine
    from tests.compat.helpers import fixture_probe

    probe = fixture_probe("h200_driver580_cuda13_trt11")  # its plugin library has another sha256
    section = {"trt_version": "11.0.0.15", "compute_capability": "9.0", "version_compatible": True,
               "plugin_library_sha256": "ab" * 32, "plugins_serialized": True}
    carried = EngineRequirements.from_manifest({"engine": section}, "manifest.json")
    assert carried.plugins_serialized and compare_engine(carried, probe) == []
    loaded = EngineRequirements.from_manifest({"engine": dict(section, plugins_serialized=False)}, "manifest.json")
    assert [f.id for f in compare_engine(loaded, probe)] == ["engine_plugin_library_mismatch"]
    # only version-compatible plans carry libraries
    plain = EngineRequirements.from_manifest({"engine": dict(section, version_compatible=False)}, "manifest.json")
    assert not plain.plugins_serialized
