"""Random model configs through export -> ONNX Runtime parity (hypothesis)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_export.export import ExportSettings, export_model
from dsa_export.model_ref import ModelReference
from dsa_export.model_source import ModelSource
from dsa_export.nn import DSACausalLM, DSAModelConfig, example_inputs
from dsa_export.runtime.onnxrt import session


@st.composite
def configs(draw):
    rope = draw(st.sampled_from([4, 8]))
    heads = draw(st.sampled_from([2, 4]))
    return DSAModelConfig(
        vocab_size=draw(st.sampled_from([64, 128])),
        hidden_size=draw(st.sampled_from([32, 48])),
        intermediate_size=64,
        layer_types=tuple(draw(st.lists(st.sampled_from(["local", "dsa", "hybrid", "dense"]), min_size=1, max_size=3))),
        num_heads=heads,
        q_lora_rank=draw(st.sampled_from([16, 24])),
        kv_lora_rank=draw(st.sampled_from([16, 32])),
        qk_nope_head_dim=draw(st.sampled_from([8, 16])),
        qk_rope_head_dim=rope,
        v_head_dim=draw(st.sampled_from([8, 16])),
        mla_form=draw(st.sampled_from(["mqa", "expanded"])),
        mla_rope_interleave=draw(st.booleans()),
        index_n_heads=16,
        index_head_dim=draw(st.sampled_from([16, 32])),
        index_topk=draw(st.integers(1, 40)),
        indexer_rope_interleave=draw(st.booleans()),
        sliding_window=draw(st.integers(1, 20)),
        local_head_dim=draw(st.sampled_from([8, 16])),
        seed=draw(st.integers(0, 1000)),
    )


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cfg=configs(), seq_len=st.integers(2, 70), mode=st.sampled_from(["plugin", "native"]))
def test_random_configs_export_and_match(tmp_path_factory, cfg, seq_len, mode):
    module = DSACausalLM(cfg).init_weights(cfg.seed).eval()
    source = ModelSource(reference=ModelReference("module", name="fuzz"), module=module,
                         example_inputs=example_inputs(cfg, 2, 24), config=cfg.to_dict())
    path = tmp_path_factory.mktemp("fuzz") / "m.onnx"
    path.write_bytes(export_model(source, ExportSettings(ops=mode)).SerializeToString())
    inputs = example_inputs(cfg, 2, seq_len, seed=3)
    (got,) = session(path).run(None, {"input_ids": inputs["input_ids"].numpy()})
    with torch.no_grad():
        want = module(**inputs).numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
