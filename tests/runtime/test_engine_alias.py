"""EngineSession binds an output the engine writes in place (``get_aliased_input_tensor``: the
DSAPagedCacheWrite plugin's pools, TensorRT's KV-cache update) to its input's buffer, over test
doubles of torch and a TensorRT engine (tests/runtime/test_engine_session.py has the plain I/O ones).

The doubles are honest where this depends on them: ``tensor.to(device, dtype)`` returns the tensor
itself when nothing changes (as torch does), a host array becomes a new device tensor, and the fake
engine refuses to run when an aliased pair is bound to two addresses (TensorRT requires one) and,
without an alias, copies the pool into the output first (a scatter layer).
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from dsa_export.errors import DSAUserError
from dsa_export.manifest import Manifest
from dsa_export.runtime.tensorrt import EngineSession, engine_aliases
from tests.runtime.test_engine_session import FakeTensor, fake_torch

POOL, PRESENT = "past_latent_pool_0", "present_latent_pool_0"


class DeviceTensor(FakeTensor):
    """A tensor on the (fake) GPU: ``to`` the same dtype is the tensor itself, ``clone`` a copy."""

    def to(self, device, dtype):
        return self if self.array.dtype == np.dtype(dtype) else DeviceTensor(self.array.astype(dtype))

    def clone(self):
        return DeviceTensor(self.array.copy())


def _torch():
    torch = fake_torch()
    torch.empty = lambda shape, dtype, device: DeviceTensor(np.zeros(shape, dtype=dtype))
    torch.from_numpy = lambda a: FakeTensor(np.asarray(a))  # host; its .to() makes a new device tensor
    return torch


def fake_paged_engine(aliased: bool):
    """Inputs input_ids [1,S] and the pool [pages,4,8]; outputs logits and the pool with row
    ``ids[0, s] % pages`` slot 0 set to s + 1 (the call's tokens)."""
    trt = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT="in", OUTPUT="out"))
    calls: dict = {"shapes": {}, "addresses": {}}
    names = ["input_ids", POOL, "logits", PRESENT]

    class Context:
        def set_input_shape(self, name, shape):
            calls["shapes"][name] = shape
            return True

        def set_tensor_address(self, name, address):
            calls["addresses"][name] = address
            return True

        def get_tensor_shape(self, name):
            return calls["shapes"][POOL] if name == PRESENT else (1, 4)

        def execute_async_v3(self, stream):
            address = calls["addresses"]
            if aliased and address[PRESENT] != address[POOL]:
                return False  # "they must share the same device memory address"
            pool = FakeTensor.registry[address[POOL]].array
            out = FakeTensor.registry[address[PRESENT]].array
            if out is not pool:
                out[...] = pool  # a scatter layer's copy
            ids = FakeTensor.registry[address["input_ids"]].array
            for s, token in enumerate(ids[0]):
                out[token % out.shape[0], 0, :] = s + 1
            return True

    class Engine:
        num_io_tensors = 4

        def get_tensor_name(self, i):
            return names[i]

        def get_tensor_mode(self, name):
            return "in" if name in ("input_ids", POOL) else "out"

        def get_tensor_dtype(self, name):
            return types.SimpleNamespace(name="INT64" if name == "input_ids" else "FLOAT")

        def create_execution_context(self):
            return Context()

    engine = Engine()
    if aliased:
        engine.get_aliased_input_tensor = lambda name: POOL if name == PRESENT else None
    return trt, engine, calls


MANIFEST = {
    "schema_version": 1,
    "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, "sequence"], "value_range": [0, 100]},
               {"name": POOL, "dtype": "float32", "shape": ["pages", 4, 8]}],
    "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, 4]},
                {"name": PRESENT, "dtype": "float32", "shape": ["pages", 4, 8]}],
    "profiles": {"dims": {"sequence": [1, 2, 8], "pages": [1, 4, 16]}},
}


def _session(tmp_path, aliased: bool):
    trt, engine, calls = fake_paged_engine(aliased)
    session = EngineSession(trt, engine, Manifest(MANIFEST, tmp_path / "manifest.json"), 0, _torch(), "fake", [])
    return session, calls


def test_an_aliased_pool_is_written_in_the_buffer_fed_as_its_past(tmp_path):
    session, calls = _session(tmp_path, aliased=True)
    assert session.aliased == {PRESENT: POOL}
    pool = DeviceTensor(np.zeros((4, 4, 8), np.float32))
    ids = np.array([[1, 2]])
    out = session.run_resident({"input_ids": ids, POOL: pool}, {PRESENT}, alias={PRESENT: POOL})
    assert out[PRESENT] is pool  # no second buffer
    assert calls["addresses"][PRESENT] == calls["addresses"][POOL] == pool.data_ptr()
    assert pool.array[1, 0, 0] == 1 and pool.array[2, 0, 0] == 2 and pool.array[3].sum() == 0


def test_an_aliased_pool_fed_without_asking_for_the_alias_is_left_as_it_was(tmp_path):
    session, calls = _session(tmp_path, aliased=True)
    pool = DeviceTensor(np.zeros((4, 4, 8), np.float32))
    out = session.run_resident({"input_ids": np.array([[1]]), POOL: pool}, {PRESENT})
    assert pool.array.sum() == 0 and out[PRESENT] is not pool  # the engine wrote a private copy
    assert calls["addresses"][PRESENT] == calls["addresses"][POOL] != pool.data_ptr()
    assert out[PRESENT].array[1, 0, 0] == 1
    host = np.zeros((4, 4, 8), np.float32)
    written = session.run({"input_ids": np.array([[2]]), POOL: host})[PRESENT]  # plain run: host in, host out
    assert host.sum() == 0 and written[2, 0, 0] == 1


def test_an_engine_that_reports_no_alias_returns_the_pool_in_a_buffer_of_its_own(tmp_path):
    session, calls = _session(tmp_path, aliased=False)
    assert session.aliased == {}
    pool = DeviceTensor(np.zeros((4, 4, 8), np.float32))
    out = session.run_resident({"input_ids": np.array([[1, 2]]), POOL: pool}, {PRESENT}, alias={PRESENT: POOL})
    assert out[PRESENT] is not pool and pool.array.sum() == 0
    assert calls["addresses"][PRESENT] != calls["addresses"][POOL]
    assert out[PRESENT].array[2, 0, 0] == 2


def test_engine_aliases_keeps_only_pairs_of_the_engines_own_inputs():
    engine = types.SimpleNamespace(get_aliased_input_tensor=lambda name: {"a": "x", "b": "", "c": "nowhere"}.get(name))
    assert engine_aliases(engine, ["x"], ["a", "b", "c", "d"]) == {"a": "x"}
    assert engine_aliases(types.SimpleNamespace(), ["x"], ["a"]) == {}  # TensorRT before 10.15


def test_a_shape_mismatch_of_an_aliased_pair_is_refused(tmp_path):
    session, calls = _session(tmp_path, aliased=True)
    session.context.get_tensor_shape = lambda name: (8, 4, 8) if name == PRESENT else (1, 4)
    with pytest.raises(DSAUserError, match="writes output 'present_latent_pool_0' .* whose shape differs"):
        session.run_resident({"input_ids": np.array([[1]]), POOL: DeviceTensor(np.zeros((4, 4, 8), np.float32))},
                             {PRESENT}, alias={PRESENT: POOL})


def test_stage_pools_ask_every_session_for_the_alias():
    """StagePools names each present pool's past pool to any session's run_resident: the engine
    decides whether it can honour it (ONNX Runtime's CPU provider, an aliased engine)."""
    from dsa_export.manifest import TensorSpec
    from dsa_export.runtime.paged import StagePools

    seen = []

    class Engineish:  # no binds_in_place: not ONNX Runtime
        def run_resident(self, feeds, keep, alias=None):
            seen.append(alias)
            return {PRESENT: feeds[POOL], "logits": np.zeros(1)}

    pools = StagePools(Engineish(), [TensorSpec(POOL, "float32", ("pages", 4, 8))])
    out = pools.run({"block_table": np.array([[1, 2]], np.int32), "input_ids": np.zeros((1, 1), np.int64)})
    assert seen == [{PRESENT: POOL}] and set(out) == {"logits"} and pools.values[POOL].shape[0] >= 3
