"""Calibration data: what is accepted, what is refused (before anything is written)."""

from __future__ import annotations

import numpy as np
import pytest

from dsa_export.errors import DSAUserError
from dsa_export.quantize.calibrate import InputSpec, check_feeds, load_feeds

IDS = InputSpec("input_ids", np.dtype(np.int64), ("batch", "sequence"))
HIDDEN = InputSpec("hidden", np.dtype(np.float32), ("batch", "sequence", 8))


def _check(feeds, specs=(IDS,)):
    check_feeds(feeds, [f"sample {i}" for i in range(len(feeds))], list(specs))


def test_good_feeds_pass():
    _check([{"input_ids": np.zeros((2, 5), np.int64)}, {"input_ids": np.zeros((1, 9), np.int64)}])
    _check([{"input_ids": np.zeros((2, 5), np.int64), "hidden": np.ones((2, 5, 8), np.float32)}], (IDS, HIDDEN))


@pytest.mark.parametrize(
    ("feed", "match"),
    [
        ({"input_ids": np.zeros((2, 5), np.int32)}, "int32, but the model takes int64"),
        ({"input_ids": np.zeros((10,), np.int64)}, "rank 2"),
        ({"input_ids": np.zeros((2, 0), np.int64)}, "empty"),
        ({"tokens": np.zeros((2, 5), np.int64)}, "missing input_ids"),
    ],
)
def test_bad_feeds_are_refused(feed, match):
    with pytest.raises(DSAUserError, match=match):
        _check([feed])


def test_nan_inf_fixed_dims_and_symbol_clashes_are_refused():
    ids = np.zeros((2, 5), np.int64)
    bad = np.ones((2, 5, 8), np.float32)
    bad[0, 0, 0] = np.inf
    with pytest.raises(DSAUserError, match="NaN or Inf"):
        _check([{"input_ids": ids, "hidden": bad}], (IDS, HIDDEN))
    with pytest.raises(DSAUserError, match="fixes it to 8"):
        _check([{"input_ids": ids, "hidden": np.ones((2, 5, 4), np.float32)}], (IDS, HIDDEN))
    with pytest.raises(DSAUserError, match="two sizes"):
        _check([{"input_ids": ids, "hidden": np.ones((2, 6, 8), np.float32)}], (IDS, HIDDEN))
    with pytest.raises(DSAUserError, match="no samples"):
        _check([])


def test_folders_scripts_and_npy(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DSAUserError, match="holds no .npz or .npy"):
        load_feeds(empty, [IDS])
    with pytest.raises(DSAUserError, match="does not exist"):
        load_feeds(tmp_path / "nope", [IDS])
    np.save(tmp_path / "a.npy", np.ones((1, 4), np.int64))
    feeds, labels = load_feeds(tmp_path / "a.npy", [IDS])
    assert feeds[0]["input_ids"].shape == (1, 4) and labels == [str(tmp_path / "a.npy")]
    script = tmp_path / "loader.py"
    script.write_text(
        "import numpy as np\n"
        "def load_data():\n"
        "    for n in (3, 4):\n"
        "        yield {'input_ids': np.zeros((1, n), np.int64)}\n"
        "def broken():\n"
        "    raise RuntimeError('boom')\n"
    )
    feeds, _ = load_feeds(str(script), [IDS])
    assert [f["input_ids"].shape[1] for f in feeds] == [3, 4]
    with pytest.raises(DSAUserError, match="boom"):
        load_feeds(f"{script}:broken", [IDS])


def test_entropy_clips_no_more_than_minmax(exported, tmp_path):
    import onnx

    from dsa_export.quantize.calibrate import collect_amax
    from dsa_export.quantize.qdq import plan
    from dsa_export.quantize.recipe import CALIBRATION_DIR

    feeds, _ = load_feeds(CALIBRATION_DIR / "data" / "tiny", [IDS])
    tensors = plan(onnx.load(str(exported["plugin"]))).activations[:4]
    minmax = collect_amax(exported["plugin"], feeds[:4], tensors, "minmax")
    entropy = collect_amax(exported["plugin"], feeds[:4], tensors, "entropy", num_bins=256)
    for name in tensors:
        assert 0 < entropy[name] <= minmax[name] * (1 + 1e-6)



def test_fp16_outputs_are_observed_in_float32():
    from dsa_export.quantize.calibrate import _Float32Outputs

    class Session:
        def run(self, names, feed):
            return [np.full(3, 1.5, np.float16), np.arange(3)]

        def get_outputs(self):
            return ["a", "b"]

    wrapped = _Float32Outputs(Session())
    a, b = wrapped.run(None, {})
    assert a.dtype == np.float32 and b.dtype == np.arange(3).dtype
    assert wrapped.get_outputs() == ["a", "b"]


def test_recipes_match_by_reference_or_model_type_and_reject_unknown_fields(tmp_path):
    from dsa_export.quantize.recipe import DEFAULTS, find_recipe, load_recipe

    assert find_recipe("builtin:tiny", None).name == "tiny"
    assert find_recipe("builtin:small", None).method == "percentile"
    assert find_recipe("hf:/x#graph=prefill", "deepseek_v32").name == "deepseek-v3.2"
    assert find_recipe("hf:/x#graph=prefill", "glm_moe_dsa").keep_indexer_projections is True
    assert find_recipe("some/file.py:make", None) is DEFAULTS
    bad = tmp_path / "bad.json"
    bad.write_text('{"precission": "int8"}')
    with pytest.raises(DSAUserError, match="unknown field"):
        load_recipe(bad)
    bad.write_text('{"method": "kl"}')
    with pytest.raises(DSAUserError, match="method 'kl' is unknown"):
        load_recipe(bad)
    bad.write_text('{"experts": "int4"}')
    with pytest.raises(DSAUserError, match="experts 'int4' is unknown; use one of int8, fp8, keep"):
        load_recipe(bad)
    assert find_recipe("builtin:tiny-moe", None).name == "tiny"
    assert find_recipe(None, "deepseek_v32").experts_mode == "fp8" and DEFAULTS.experts_mode == "int8"


def test_held_out_lengths_pass_the_indexer_top_k():
    """Held-out inputs generated for the report get a length past the indexer's top-k when none
    has one (below it every key is selected and the top-k overlap is 1 whatever happens)."""
    import json

    import onnx

    from dsa_export.quantize.quantizer import META_CONFIG, _eval_lengths

    model = onnx.ModelProto()
    assert _eval_lengths(model, (48, 96)) == (48, 96)  # no config recorded
    model.metadata_props.add(key=META_CONFIG, value=json.dumps({"index_topk": 256}))
    assert _eval_lengths(model, (48, 96, 160)) == (48, 96, 160, 320)
    assert _eval_lengths(model, (48, 400)) == (48, 400)
