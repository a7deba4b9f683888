"""EngineSession's I/O logic over test doubles of torch (CUDA) and a TensorRT engine.

No GPU or TensorRT exists here, so ``FakeTorch`` and ``FakeEngine`` stand in for them: they record
what EngineSession asks (input shapes, tensor addresses, the stream handed to execute_async_v3)
and compute a known function of the input, so the test can check the plumbing, not TensorRT.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from dsa_export.errors import DSAUserError
from dsa_export.manifest import Manifest


class FakeTensor:
    registry: dict[int, FakeTensor] = {}

    def __init__(self, array: np.ndarray):
        self.array = array
        FakeTensor.registry[id(self)] = self

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype)

    def to(self, device, dtype):
        return FakeTensor(self.array.astype(dtype))

    def data_ptr(self):
        return id(self)

    def float(self):
        return FakeTensor(self.array.astype(np.float32))

    def cpu(self):
        return self

    def numpy(self):
        return self.array


def fake_torch():
    log: list = []

    class Stream:
        cuda_stream = 1234

        def __init__(self, device):
            log.append(("stream", device))

        def wait_stream(self, other):
            log.append(("wait_stream", other))

        def synchronize(self):
            log.append("synchronize")

    torch = types.SimpleNamespace(
        float32=np.float32, float16=np.float16, bfloat16="bf16-unused", int64=np.int64, int32=np.int32,
        int8=np.int8, uint8=np.uint8, bool=np.bool_, float8_e4m3fn="fp8-unused",
        device=lambda kind, index: f"{kind}:{index}",
        from_numpy=lambda a: FakeTensor(np.asarray(a)),
        is_tensor=lambda value: isinstance(value, FakeTensor),
        empty=lambda shape, dtype, device: FakeTensor(np.zeros(shape, dtype=dtype)),
        cuda=types.SimpleNamespace(Stream=Stream, current_stream=lambda device: "current", device=CurrentDevice),
        log=log,
    )
    return torch


class CurrentDevice:
    """``torch.cuda.device(index)``: makes ``index`` the current CUDA device inside the block."""

    current: int | None = None

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        self.previous, CurrentDevice.current = CurrentDevice.current, self.index

    def __exit__(self, *exc):
        CurrentDevice.current = self.previous


def fake_trt_and_engine():
    trt = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT="in", OUTPUT="out"),
                                DataType=types.SimpleNamespace(INT64="INT64", FLOAT="FLOAT"))
    calls: dict = {"shapes": {}, "addresses": {}}

    class Context:
        def set_input_shape(self, name, shape):
            calls["shapes"][name] = shape
            return True

        def set_tensor_address(self, name, address):  # bool, as IExecutionContext::setTensorAddress
            calls["addresses"][name] = address
            return True

        def get_tensor_shape(self, name):
            batch, seq = calls["shapes"]["input_ids"]
            return (batch, seq, 4)

        def execute_async_v3(self, stream):
            calls["stream"] = stream
            ids = FakeTensor.registry[calls["addresses"]["input_ids"]].array
            out = FakeTensor.registry[calls["addresses"]["logits"]].array
            out[...] = ids[..., None] * np.arange(4, dtype=np.float32)  # a known function of the input
            return True

    class Engine:
        num_io_tensors = 2

        def get_tensor_name(self, i):
            return ["input_ids", "logits"][i]

        def get_tensor_mode(self, name):
            return "in" if name == "input_ids" else "out"

        def get_tensor_dtype(self, name):
            return types.SimpleNamespace(name="INT64" if name == "input_ids" else "FLOAT")

        def create_execution_context(self):
            return Context()

    return trt, Engine(), calls


MANIFEST = {
    "schema_version": 1,
    "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"], "value_range": [0, 10]}],
    "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", 4]}],
    "profiles": {"dims": {"batch": [1, 1, 4], "sequence": [1, 8, 32]}},
}


def test_engine_session_sets_shapes_addresses_and_stream(tmp_path):
    from dsa_export.runtime.tensorrt import EngineSession

    torch = fake_torch()
    trt, engine, calls = fake_trt_and_engine()
    session = EngineSession(trt, engine, Manifest(MANIFEST, tmp_path / "manifest.json"), 0, torch, "fake", [])
    feeds = session.example_inputs(seed=0)
    assert feeds["input_ids"].shape == (1, 8)
    ids = np.arange(6, dtype=np.int32).reshape(2, 3)  # int32 in: cast to the engine's int64
    out = session.run({"input_ids": ids})["logits"]
    assert calls["shapes"] == {"input_ids": (2, 3)}
    assert set(calls["addresses"]) == {"input_ids", "logits"}
    assert calls["stream"] == 1234
    assert torch.log == [("stream", "cuda:0"), ("wait_stream", "current"), "synchronize"]
    np.testing.assert_array_equal(out, ids[..., None].astype(np.float32) * np.arange(4, dtype=np.float32))
    calls["shapes"].clear()
    with pytest.raises(DSAUserError, match=r"sequence 33 .*outside the optimization profile of the engine"):
        session.run({"input_ids": np.zeros((1, 33), dtype=np.int64)})
    assert calls["shapes"] == {}  # rejected before anything reached the engine


def test_run_resident_keeps_the_named_outputs_on_the_device(tmp_path):
    """What a pipeline stage does with its caches: they come back as device tensors and go in as
    such on the next call, never through the host."""
    from dsa_export.runtime.tensorrt import EngineSession

    torch = fake_torch()
    trt, engine, calls = fake_trt_and_engine()
    session = EngineSession(trt, engine, Manifest(MANIFEST, tmp_path / "manifest.json"), 0, torch, "fake", [])
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    out = session.run_resident({"input_ids": ids}, {"logits"})
    assert isinstance(out["logits"], FakeTensor)  # not copied to the host
    np.testing.assert_array_equal(out["logits"].array, ids[..., None] * np.arange(4, dtype=np.float32))
    on_device = torch.from_numpy(ids)
    out = session.run_resident({"input_ids": on_device}, set())
    assert isinstance(out["logits"], np.ndarray)
    with pytest.raises(DSAUserError, match="token id|vocabulary|outside"):
        session.run_resident({"input_ids": np.full((1, 3), 99, np.int64)}, set())  # host inputs are checked
