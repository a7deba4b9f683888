"""The paged serving graph (``--graph paged``): ragged batches, chunked prefill, last-token logits,
cache pools written in place.

The oracle is transformers: each prompt of a ragged batch must get exactly the tokens
``generate(do_sample=False)`` gives that prompt alone, over a single paged export (DeepSeek-V3.2
and GLM-5 tiny checkpoints) and over a stage build of paged stages (GLM-5, whose shared-indexer
layer takes its selection across the stage boundary).
"""

from __future__ import annotations

import builtins
import contextlib
import json
from unittest import mock

import numpy as np
import pytest

from dsa_export.errors import DSAUserError
from dsa_export.runtime.generate import SamplingSettings, generate, read_input_ids
from dsa_export.runtime.paged import PageAllocator

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

KINDS = ["deepseek_v32", "glm_moe_dsa"]
#: Prompt lengths of the ragged batch: one page, two pages (70 > 64), a partial page.
LENGTHS = (5, 70, 13)
NEW = 10


def _prompts(seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 128, n).tolist() for n in LENGTHS]


def _hf_greedy(checkpoint, prompts: list[list[int]], new: int = NEW) -> list[list[int]]:
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(tokens[0, len(prompt):].tolist())
    return out


@pytest.fixture(scope="module")
def paged_exports(checkpoints, tmp_path_factory):
    from dsa_export.export import ExportSettings, export_model, save_model
    from dsa_export.hf.source import hf_reference
    from dsa_export.sources import resolve

    root = tmp_path_factory.mktemp("paged")
    return {kind: save_model(export_model(resolve(hf_reference(checkpoints[kind], graph="paged")), ExportSettings()),
                             root / f"{kind}-paged.onnx") for kind in KINDS}


@contextlib.contextmanager
def _file_reads():
    """Every file on disk opened for reading inside the block (Python's open, which pathlib, numpy,
    json and onnx.load all go through), as a list of paths. The kernel's memory counters (/proc,
    /sys: the free-memory check of a run larger than any before, e.g. the prefill) are not files
    on disk."""
    opened: list[str] = []
    real = builtins.open

    def spy(file, mode="r", *args, **kwargs):
        if "r" in mode and not str(file).startswith(("/proc/", "/sys/")):
            opened.append(str(file))
        return real(file, mode, *args, **kwargs)

    with mock.patch("builtins.open", spy), mock.patch("io.open", spy):
        yield opened


def _open(path):
    from dsa_export.runtime import load
    from dsa_export.stages.session import PipelineSession

    return PipelineSession.of_session(load(path, "onnxruntime"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_ragged_batch_gets_each_prompts_transformers_tokens(checkpoints, paged_exports, kind):
    prompts = _prompts()
    want = _hf_greedy(checkpoints[kind], prompts)
    model = _open(paged_exports[kind])
    try:
        for chunk, micro in ((None, 1), (16, 1), (None, 3)):
            with _file_reads() as opened:  # the session is open: generating reads no file
                result = generate(model, prompts, SamplingSettings(max_new_tokens=NEW, prefill_chunk=chunk,
                                                                   micro_batches=micro))
            assert opened == [], opened
            assert result.tokens.tolist() == want, (chunk, micro)
            assert result.prompt_tokens == sum(LENGTHS)
            assert model.pages.pages_in_use == 0  # every sequence handed its pages back
    finally:
        model.close()


def test_prompts_longer_than_a_call_of_the_build_are_prefilled_in_chunks(paged_exports):
    """A build whose prefill profile takes fewer tokens per row than a prompt holds (``--max-shapes
    sequence=16``, or the C++ runtime's chunks): generate feeds the prompt in calls of that many
    tokens, with the tokens of one whole-prompt call."""
    model = _open(paged_exports["deepseek_v32"])
    try:
        want = generate(model, _prompts(), SamplingSettings(max_new_tokens=NEW)).tokens.tolist()
        described = model.describe()
        widths: list[int] = []
        forward = model.forward

        def recorded(feeds, slot, micro):
            widths.append(feeds["input_ids"].shape[1])
            return forward(feeds, slot, micro)

        with mock.patch.object(model, "describe", lambda: [dict(d, call_limit=16) for d in described]), \
                mock.patch.object(model, "forward", recorded):
            got = generate(model, _prompts(), SamplingSettings(max_new_tokens=NEW))
            assert got.tokens.tolist() == want
            assert widths[:6] == [16, 16, 16, 16, 6, 1]  # 70 tokens: 4 calls of 16, one of 6, then decode
            assert max(widths) == 16
            widths.clear()
            generate(model, _prompts(), SamplingSettings(max_new_tokens=2, prefill_chunk=40))
            assert widths == [16, 16, 16, 16, 6, 1]  # a chunk above the build's limit is the limit
    finally:
        model.close()


def test_the_paged_graph_returns_last_token_logits_and_validates(paged_exports):
    import onnx

    from dsa_export.validate import ValidationSettings, validate_onnx

    graph = onnx.load(str(paged_exports["deepseek_v32"]), load_external_data=False).graph
    (logits,) = [o for o in graph.output if o.name == "logits"]
    assert [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim] == ["batch", 128]
    ops = [n.op_type for n in graph.node]
    assert ops.count("ScatterND") == 6 and "DSAIndexerTopK" not in ops and ops.count("DSAIndexerTopKPaged") == 3
    report = validate_onnx(paged_exports["deepseek_v32"], ValidationSettings(seq_lens=(16, 80)))
    assert report.passed, report


def test_pools_are_written_in_place(paged_exports):
    """On ONNX Runtime's CPU provider a step writes only its tokens' rows: the pools stay the same
    buffers, and every other row (padding goes to the scratch page 0) keeps its bytes."""
    model = _open(paged_exports["deepseek_v32"])
    try:
        stage = model.handles[0].stage
        pages = model.pages
        prompts = [list(range(1, 40)), list(range(5, 100))]
        for row, prompt in enumerate(prompts):
            pages.ensure(("s", row), len(prompt))
        width = max(map(len, prompts))
        ids = np.zeros((2, width), np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = prompt
        table = pages.table([("s", 0), ("s", 1)])
        feeds = {"input_ids": ids, "query_start": np.zeros(2, np.int32),
                 "query_lengths": np.array([39, 95], np.int32), "block_table": table}
        model.forward(feeds, "s")
        pools = stage.pools
        assert pools.in_place and pools.pages >= 4
        host = dict(pools._host)
        before = {name: array.copy() for name, array in host.items()}
        pointers = {name: value.data_ptr() for name, value in pools.values.items()}
        assert all(pointers[name] == host[name].ctypes.data for name in host)
        for row, length in enumerate((39, 95)):
            pages.ensure(("s", row), length + 1)
        step = {"input_ids": np.array([[7], [9]]), "query_start": np.array([39, 95], np.int32),
                "query_lengths": np.ones(2, np.int32), "block_table": pages.table([("s", 0), ("s", 1)])}
        logits = model.forward(step, "s")["logits"]
        assert logits.shape == (2, 128)
        table = step["block_table"]
        written = {(int(table[0, 0]), 39), (int(table[1, 1]), 95 - 64)}
        for name, array in host.items():
            assert pools._host[name] is array and pools.values[name].data_ptr() == pointers[name]
            changed = {tuple(map(int, rc)) for rc in np.argwhere((array != before[name]).any(-1))}
            assert changed == written, name
    finally:
        model.close()


def test_a_stage_build_of_paged_stages_generates_a_ragged_batch(checkpoints, tmp_path):
    from tests.stages.test_session import _cli

    checkpoint = checkpoints["glm_moe_dsa"]
    out = tmp_path / "build"
    result = _cli("build", checkpoint, "--stages", 2, "--graph", "paged", "--max-batch", 4, "--max-seq", 128,
                  "--prefill-chunk", 32, "-o", out)
    assert result.exit_code == 0, result.output
    pipeline = json.loads((out / "pipeline.json").read_text())
    assert pipeline["graph"] == "paged"
    assert all(stage["caches"] and all("_pool_" in c for c in stage["caches"]) for stage in pipeline["stages"])
    manifest = json.loads((out / "stage_00" / "manifest.json").read_text())
    # Prefill (32 prompt tokens per row and call: --prefill-chunk) and decode (one token), over
    # sequences of up to 128 tokens; pools of up to twice the pages 4 rows of 2 pages need, plus
    # the scratch page.
    profiles = manifest["profiles"]["all"]
    assert [p["sequence"] for p in profiles] == [[1, 32, 32], [1, 1, 1]]
    assert [p["max_pages"] for p in profiles] == [[1, 2, 2]] * 2 and [p["pages"] for p in profiles] == [[2, 3, 18]] * 2
    prompts = _prompts(seed=5)
    (tmp_path / "ids.json").write_text(json.dumps(prompts))
    result = _cli("generate", out, "--input-ids", tmp_path / "ids.json", "--max-new-tokens", NEW,
                  "--prefill-chunk", 16, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tokens"] == _hf_greedy(checkpoint, prompts)
    assert report["prompt_ids"] == prompts
    # Once the stages are open, neither prefill nor a decode step reads a file.
    from dsa_export.stages.session import PipelineSession

    model = PipelineSession.open(out)
    try:
        with _file_reads() as opened:  # the 70-token prompt goes in calls of the build's 32 unasked
            again = generate(model, prompts, SamplingSettings(max_new_tokens=NEW))
        assert again.tokens.tolist() == report["tokens"]
        assert opened == []
    finally:
        model.close()
    # The build's profiles hold 128 tokens per sequence (two pages of 64).
    long = [list(range(1, 130))]
    (tmp_path / "long.json").write_text(json.dumps(long))
    result = _cli("generate", out, "--input-ids", tmp_path / "long.json")
    assert result.exit_code == 1 and "holds at most 128" in result.output and "Traceback" not in result.output


def test_repeated_prompts_print_each_continuation(checkpoints, paged_exports, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tests.stages.test_session import _cli, word_tokenizer

    word_tokenizer(tokenizers, tmp_path / "tokenizer.json")
    prompts = [[5, 17, 3], [1, 2, 3, 4, 5, 6, 7, 8]]
    texts = [" ".join(f"w{i}" for i in p) for p in prompts]
    args = ["generate", paged_exports["deepseek_v32"], "--prompt", texts[0], "--prompt", texts[1], "--tokenizer",
            tmp_path / "tokenizer.json", "--max-new-tokens", 4]
    want = _hf_greedy(checkpoints["deepseek_v32"], prompts, 4)
    result = _cli(*args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for row, (text, tokens) in enumerate(zip(texts, want)):
        assert lines[row] == f"[{row}] {text} " + " ".join(f"w{i}" for i in tokens)
    report = json.loads(_cli(*args, "--json").stdout)
    assert report["tokens"] == want and len(report["texts"]) == 2


def test_ragged_prompts_over_a_decode_graph_are_refused():
    class DecodeGraph:  # what generate sees of a decode-graph pipeline (a test double)
        paged = False

        class _Spec:
            def __init__(self, name):
                self.name = name

        inputs = [_Spec("input_ids"), _Spec("attention_mask"), _Spec("past_latent_0")]
        step_inputs = inputs[:2]

        def sequence_limit(self):
            return None

    with pytest.raises(DSAUserError, match="different lengths .*--graph paged"):
        generate(DecodeGraph(), [[1, 2, 3], [4, 5]])
    with pytest.raises(DSAUserError, match="prompt 1 must be a non-empty list"):
        generate(DecodeGraph(), [[1, 2, 3], []])


def test_json_token_ids(tmp_path):
    path = tmp_path / "ids.json"
    path.write_text("[[1, 2, 3], [4]]")
    assert [row.tolist() for row in read_input_ids(path)] == [[1, 2, 3], [4]]
    path.write_text("[7, 8]")
    assert [row.tolist() for row in read_input_ids(path)] == [[7, 8]]
    for bad, words in (("[[1, 2], []]", "prompt 1"), ("[[1.5]]", "prompt 0"), ("[[true]]", "prompt 0"),
                       ("[[-1]]", "prompt 0"), ("{}", "no list"), ("[1, [2]]", "prompt 0"), ("[[1,", "cannot read")):
        path.write_text(bad)
        with pytest.raises(DSAUserError, match=words):
            read_input_ids(path)


def test_page_allocator_hands_out_pages_and_takes_them_back():
    pages = PageAllocator(64, limit=5)
    pages.ensure("a", 65)  # two pages
    pages.ensure("b", 1)
    assert pages.tables == {"a": [1, 2], "b": [3]}
    assert pages.table(["a", "b"]).tolist() == [[1, 2], [3, -1]]
    pages.ensure("a", 128)  # still two
    pages.release("a")
    pages.ensure("c", 129)  # reuses 1 and 2, then takes 4
    assert pages.tables["c"] == [1, 2, 4] and pages.pages_in_use == 4
    with pytest.raises(DSAUserError, match="5 pages of 64 tokens and all are in use"):
        pages.ensure("d", 1)


def test_stage_pools_grow_by_doubling_within_the_builds_limit():
    from types import SimpleNamespace

    from dsa_export.manifest import TensorSpec
    from dsa_export.runtime.paged import StagePools, pool_inputs

    class Session:  # an engine-like session (a test double): writes a new pool, as TensorRT does
        inputs = [TensorSpec("block_table", "int32", ("batch", "max_pages")),
                  TensorSpec("past_latent_pool_0", "float32", ("pages", 64, 8))]
        manifest = SimpleNamespace(profile_sets=[{"pages": (2, 3, 6)}, {"pages": (2, 3, 6)}])

        def run(self, feeds):
            pool = feeds["past_latent_pool_0"]
            written = pool.copy()
            written[feeds["block_table"][0, 0], 0] += 1.0
            return {"present_latent_pool_0": written, "logits": np.zeros((1, 4), np.float32)}

    pools = StagePools(Session(), pool_inputs(Session.inputs))
    assert pools.limit == 6 and not pools.in_place
    out = pools.run({"block_table": np.array([[2, -1]], np.int32)})
    assert set(out) == {"logits"} and pools.pages == 3  # page 2 named: 3 pages (at least 2)
    assert pools.values["past_latent_pool_0"][2, 0].tolist() == [1.0] * 8
    pools.run({"block_table": np.array([[4]], np.int32)})  # 5 pages needed: doubled to 6 (the limit)
    pool = pools.values["past_latent_pool_0"]
    assert pools.pages == 6 and pool.shape == (6, 64, 8)
    assert pool[2, 0].tolist() == [1.0] * 8 and pool[4, 0].tolist() == [1.0] * 8  # old rows kept
    with pytest.raises(DSAUserError, match="at most 6 pages"):
        pools.run({"block_table": np.array([[6]], np.int32)})
