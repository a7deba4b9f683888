"""Pipeline stages: stage builds, the local pipeline, Ray actors, micro-batch overlap, generation.

The oracle is transformers: a 4-layer tiny DeepSeek-V3.2 built as 2 stages and a 4-layer GLM-5
built as 3 (layer 3 reuses layer 2's top-k selection, handed across the stage boundary) must
generate exactly what ``generate(do_sample=False)`` does, locally and on a local Ray cluster.
"""

from __future__ import annotations

import io
import json
import shutil
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import numpy as np
import pytest

from dsa_export.cli.main import main
from dsa_export.errors import DSAUserError
from dsa_export.manifest import TensorSpec
from dsa_export.runtime.generate import SamplingSettings, choose_tokens, generate
from dsa_export.stages.session import LocalStage, PipelineSession, ThreadStage

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

NEW_TOKENS = 24
BUILDS = [("deepseek_v32", 2), ("glm_moe_dsa", 3)]


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _cli(*args) -> Ran:
    """``dsa-export ARGS`` in this process, with the exit code the command line would give."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return Ran(code, out.getvalue(), err.getvalue())


def _hf_greedy(checkpoint, prompt: np.ndarray) -> np.ndarray:
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    ids = torch.from_numpy(prompt)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[:, prompt.shape[1]:].numpy()


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{(kind, stages): (checkpoint, stage build folder, stages)}: DeepSeek-V3.2 built as 2 stages and
    GLM-5 as 3 through the CLI (GLM-5's 3-stage cut puts the shared-indexer layer 3 after a
    boundary; tests/hf/test_paged.py builds GLM-5 as 2 paged stages)."""
    from tests.hf.conftest import make_checkpoint

    root = tmp_path_factory.mktemp("stages")
    made = {}
    for kind, stages in BUILDS:
        checkpoint = make_checkpoint(root, kind, layers=4, index_topk=8)
        out = root / f"{kind}-{stages}"
        result = _cli("build", checkpoint, "--stages", stages, "--max-batch", 2, "--max-seq", 64, "-o", out)
        assert result.exit_code == 0, result.output
        made[kind, stages] = (checkpoint, out, stages)
    return made


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def word_tokenizer(tokenizers, path) -> None:
    """Write a tokenizer.json whose token ``i`` is the word ``w{i}`` (128 words, decoded with spaces)."""
    vocab = {f"w{i}": i for i in range(128)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(path))


def _prompt(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 128, (2, 7)).astype(np.int64)


def test_stage_build_records_every_stage(builds):
    _checkpoint, out, stages = builds["glm_moe_dsa", 3]
    data = json.loads((out / "pipeline.json").read_text())
    assert [s["build"] for s in data["stages"]] == [f"stage_{i:02d}" for i in range(stages)]
    assert all(s["build_key"] and s["caches"] for s in data["stages"])
    assert {(l["output"], l["input"]) for l in data["links"]} == {("hidden_states_out", "hidden_states"),
                                                                  ("topk_indices", "prev_topk_indices")}
    manifest = json.loads((out / "stage_00" / "manifest.json").read_text())
    # Two profiles: the whole prompt without a past, and one token with a past.
    assert [p["past_sequence"] for p in manifest["profiles"]["all"]] == [[0, 0, 0], [1, 63, 63]]


def test_unchanged_stages_are_kept(builds):
    _checkpoint, out, _stages = builds["deepseek_v32", 2]
    result = _cli(*["build", str(out / "export"), "--max-batch", "2", "--max-seq", "64",
                                      "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [s["status"] for s in report["stages"]] == ["kept", "kept"]


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: f"{b[0]}-{b[1]}")
def test_generate_over_the_local_pipeline_matches_transformers(builds, build, tmp_path):
    checkpoint, out, _stages = builds[build]
    prompt = _prompt()
    np.save(tmp_path / "ids.npy", prompt)
    result = _cli(*["generate", str(out), "--input-ids", str(tmp_path / "ids.npy"),
                                      "--max-new-tokens", str(NEW_TOKENS), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    np.testing.assert_array_equal(np.asarray(report["tokens"]), _hf_greedy(checkpoint, prompt))
    assert report["decode_tokens_per_s"] > 0 and report["prefill_tokens_per_s"] > 0


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: f"{b[0]}-{b[1]}")
def test_generate_over_ray_matches_transformers(builds, ray_cluster, build, tmp_path):
    checkpoint, out, _stages = builds[build]
    prompt = _prompt(1)
    np.save(tmp_path / "ids.npy", prompt)
    result = _cli(*["generate", str(out), "--input-ids", str(tmp_path / "ids.npy"), "--ray", "auto",
                                      "--max-new-tokens", str(NEW_TOKENS), "--micro-batches", "2", "--json"])
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(np.asarray(json.loads(result.stdout)["tokens"]), _hf_greedy(checkpoint, prompt))


def _full_feeds(session: PipelineSession, prompt: np.ndarray) -> dict[str, np.ndarray]:
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt)}
    for spec in session.inputs:
        if spec.name.startswith("past_"):
            feeds[spec.name] = np.zeros((prompt.shape[0], 0, spec.shape[2]), np.float32)
    return feeds


def test_ray_and_local_pipelines_give_identical_logits(builds, ray_cluster):
    from dsa_export.stages.ray_actors import open_on_ray

    _checkpoint, out, stages = builds["glm_moe_dsa", 3]
    local, remote = PipelineSession.open(out), open_on_ray(out)
    try:
        feeds = _full_feeds(local, _prompt(2))
        want = local.run(feeds)
        got = remote.run(feeds)
        assert sorted(got) == sorted(want) and "logits" in got
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(local.run_microbatches(feeds, 2)["logits"], want["logits"])
    finally:
        local.close()
        remote.close()


def test_a_stage_actor_killed_mid_run_is_one_clear_error(builds, ray_cluster):
    from dsa_export.stages.ray_actors import open_on_ray

    _checkpoint, out, _stages = builds["glm_moe_dsa", 3]
    # The stage export: no profile limits the length, so the run is still going when the actor dies.
    remote = open_on_ray(out / "export", timeout=60)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            generate(remote, _prompt(), SamplingSettings(max_new_tokens=480))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    try:
        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(1.5)  # generation is running: prefill is done, decode steps follow each other
        assert worker.is_alive()
        ray_cluster.kill(remote.handles[1].actor)
        began = time.perf_counter()
        worker.join(60)
        assert not worker.is_alive(), "generation hung after a stage actor died"
        assert time.perf_counter() - began < 30
        assert len(failure) == 1 and isinstance(failure[0], DSAUserError), failure
        assert str(failure[0]).startswith("stage 1's Ray actor died because it was killed")
    finally:
        remote.close()


def test_stage_builds_run_as_ray_tasks(builds, ray_cluster, tmp_path):
    _checkpoint, out, stages = builds["glm_moe_dsa", 3]
    target = tmp_path / "ray-build"
    result = _cli("build", out / "export", "--ray", "auto", "--backend", "onnxruntime", "--no-validate",
                  "--max-batch", "2", "--max-seq", "64", "-o", target, "--json")
    assert result.exit_code == 0, result.output
    assert [s["status"] for s in json.loads(result.stdout)["stages"]] == ["built"] * stages
    assert all((target / f"stage_{i:02d}" / "manifest.json").is_file() for i in range(stages))
    prompt = _prompt(3)
    local, built = PipelineSession.open(out), PipelineSession.open(target)
    try:
        a = generate(local, prompt, SamplingSettings(max_new_tokens=6)).tokens
        b = generate(built, prompt, SamplingSettings(max_new_tokens=6)).tokens
    finally:
        local.close()
        built.close()
    np.testing.assert_array_equal(a, b)


def test_an_engine_stage_without_its_gpu_is_one_clear_error(builds):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _checkpoint, out, _stages = builds["deepseek_v32", 2]
    with pytest.raises(DSAUserError, match=r"^stage 0 \(layers 0:2\) runs on GPU 0 but this machine has 0 GPU"):
        PipelineSession.open(out, "engine")


class _Sleeper:
    """A stage that takes ``seconds`` per call and adds one to its input (a test double)."""

    kind = "sleeper"
    notes: list = []

    def __init__(self, seconds: float, first: bool):
        self.seconds = seconds
        self.inputs = [TensorSpec("x" if first else "h", "float32", ("batch", 4))]
        self.outputs = [TensorSpec("h" if first else "y", "float32", ("batch", 4))]
        self.calls = 0
        self.busy = threading.Lock()

    def run(self, feeds):
        assert self.busy.acquire(blocking=False), "a stage ran two calls at once"
        try:
            time.sleep(self.seconds)
            self.calls += 1
            (value,) = feeds.values()
            return {self.outputs[0].name: value + 1}
        finally:
            self.busy.release()

    def close(self):
        pass


def _sleeper_pipeline(seconds: float) -> PipelineSession:
    from dsa_export.stages.record import Pipeline, StageFiles, StageLink

    stages = [_Sleeper(seconds, True), _Sleeper(seconds, False)]
    files = [StageFiles(index=i, layers=(i, i + 1), embed=i == 0, head=i == 1, onnx="", data=None, sha256={}, sizes={},
                        inputs=s.inputs, outputs=s.outputs, weight_bytes=0, checkpoint_bytes=0, key="", plan={})
             for i, s in enumerate(stages)]
    pipeline = Pipeline(model={}, model_type="", num_layers=2, graph="prefill", settings={}, plan={}, stages=files,
                        links=[StageLink(0, 1, "h", "h")], tool_version="")
    from dsa_export.stages.session import InLink

    handles = [ThreadStage(LocalStage(0, stages[0], [], "host")),
               ThreadStage(LocalStage(1, stages[1], [InLink(0, "h", "h")], "host"))]
    return PipelineSession(pipeline, handles, "sleepers")


def test_micro_batches_overlap_the_stages():
    seconds = 0.15
    session = _sleeper_pipeline(seconds)
    try:
        x = np.arange(16, dtype=np.float32).reshape(4, 4)
        began = time.perf_counter()
        serial = [session.run({"x": x[i:i + 1]})["y"] for i in range(4)]
        serial_s = time.perf_counter() - began
        began = time.perf_counter()
        overlapped = session.run_microbatches({"x": x}, 4)["y"]
        overlapped_s = time.perf_counter() - began
    finally:
        session.close()
    np.testing.assert_array_equal(overlapped, np.concatenate(serial))
    np.testing.assert_array_equal(overlapped, x + 2)
    # 4 micro-batches over 2 stages: (4 + 1) / 8 of the serial time when the stages overlap.
    assert serial_s >= 8 * seconds
    assert overlapped_s / serial_s < 0.75, (overlapped_s, serial_s)
    assert overlapped_s >= 5 * seconds


class _Recorder(_Sleeper):
    """A one-stage double that records the thread each call ran on, and fails on a negative input."""

    def __init__(self):
        super().__init__(0.0, True)
        self.outputs = [TensorSpec("y", "float32", ("batch", 4))]
        self.threads: list[str] = []

    def run(self, feeds):
        self.threads.append(threading.current_thread().name)
        if (feeds["x"] < 0).any():
            raise DSAUserError("negative input")
        return super().run(feeds)


def test_a_one_stage_pipeline_runs_in_the_callers_thread():
    stage = _Recorder()
    session = PipelineSession.of_session(stage)
    try:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(session.run({"x": x})["y"], x + 1)
        np.testing.assert_array_equal(session.run_microbatches({"x": x}, 2)["y"], x + 1)
        with pytest.raises(DSAUserError, match="^negative input$"):
            session.run({"x": -x})
        np.testing.assert_array_equal(session.run({"x": x})["y"], x + 1)  # the error left it usable
    finally:
        session.close()
    assert stage.threads == [threading.current_thread().name] * 5


def test_missing_stage_build_is_one_clear_error(builds, tmp_path):
    _checkpoint, out, _stages = builds["deepseek_v32", 2]
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "stage_01")
    np.save(tmp_path / "ids.npy", _prompt())
    result = _cli(*["generate", str(copy), "--input-ids", str(tmp_path / "ids.npy")])
    assert result.exit_code == 1
    assert "stage 1 (layers 2:4): its build folder" in result.output and "Traceback" not in result.output


def test_generate_streams_text_with_a_tokenizer(builds, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    word_tokenizer(tokenizers, tmp_path / "tokenizer.json")
    checkpoint, out, _stages = builds["deepseek_v32", 2]
    prompt = "w5 w17 w3 w99"
    result = _cli(*["generate", str(out), "--prompt", prompt, "--tokenizer",
                                      str(tmp_path / "tokenizer.json"), "--max-new-tokens", "6"])
    assert result.exit_code == 0, result.output
    want = _hf_greedy(checkpoint, np.array([[5, 17, 3, 99]]))[0, :6]
    assert result.stdout.startswith(prompt + " " + " ".join(f"w{i}" for i in want))
    assert "decode:" in result.stderr and "tokens/s" in result.stderr


def test_generate_usage_errors(builds, tmp_path):
    _checkpoint, out, _stages = builds["deepseek_v32", 2]
    assert _cli("generate", out).exit_code == 2
    result = _cli(*["generate", str(out), "--prompt", "hi"])
    assert result.exit_code == 1 and "tokenizer.json does not exist" in result.output
    np.save(tmp_path / "bad.npy", np.zeros((2, 3), np.float32))
    result = _cli(*["generate", str(out), "--input-ids", str(tmp_path / "bad.npy")])
    assert result.exit_code == 1 and "integer ids" in result.output
    result = _cli(*["generate", str(out), "--input-ids", str(tmp_path / "bad.npy"), "--top-p", "0.5"])
    assert result.exit_code == 2


def test_sampling_is_seeded_and_respects_top_p():
    rng_logits = np.random.default_rng(0).standard_normal((3, 50))
    greedy = choose_tokens(rng_logits, SamplingSettings(), np.random.default_rng(0))
    np.testing.assert_array_equal(greedy, rng_logits.argmax(-1))
    # A nucleus too small for a second token leaves only the arg max.
    tight = SamplingSettings(temperature=1.0, top_p=1e-6)
    np.testing.assert_array_equal(choose_tokens(rng_logits, tight, np.random.default_rng(5)), greedy)
    loose = SamplingSettings(temperature=2.0, top_p=0.9)
    a = [choose_tokens(rng_logits, loose, np.random.default_rng(7)) for _ in range(2)]
    np.testing.assert_array_equal(a[0], a[1])
    draws = np.stack([choose_tokens(rng_logits, loose, np.random.default_rng(s)) for s in range(200)])
    assert len(np.unique(draws[:, 0])) > 3  # it does sample


def test_generate_stops_when_every_sequence_ended():
    class Fixed:
        """A one-stage decode model whose next token is always 3 (a test double)."""

        kind, notes = "fixed", []
        inputs = [TensorSpec("input_ids", "int64", ("batch", "sequence")),
                  TensorSpec("attention_mask", "int64", ("batch", "total_sequence")),
                  TensorSpec("past_k", "float32", ("batch", "past_sequence", 2))]
        outputs = [TensorSpec("logits", "float32", ("batch", "sequence", 5)),
                   TensorSpec("present_k", "float32", ("batch", "total_sequence", 2))]

        def run(self, feeds):
            b, s = feeds["input_ids"].shape
            logits = np.zeros((b, s, 5), np.float32)
            logits[..., 3] = 1
            return {"logits": logits, "present_k": np.concatenate([feeds["past_k"], np.zeros((b, s, 2))], 1)}

        def close(self):
            pass

    model = PipelineSession.of_session(Fixed())
    result = generate(model, np.zeros((2, 4), np.int64), SamplingSettings(max_new_tokens=10, eos_token_ids=(3,)))
    assert result.tokens.tolist() == [[3], [3]]
    result = generate(model, np.zeros((2, 4), np.int64), SamplingSettings(max_new_tokens=5))
    assert result.tokens.shape == (2, 5) and result.steps == 4


def test_run_takes_a_pipeline_folder(builds):
    _checkpoint, out, _stages = builds["glm_moe_dsa", 3]
    result = _cli("run", out, "--dims", "batch=2,sequence=5", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["runtime"].startswith("pipeline of 3 stages")
    shapes = {o["name"]: o["shape"] for o in report["outputs"]}
    assert shapes["logits"] == [2, 5, 128] and shapes["present_latent_3"][:2] == [2, 5]


def test_a_stage_keeps_an_engines_caches_on_its_device():
    class Resident:
        """An engine-like session (a test double): ``run_resident`` returns the kept outputs as
        opaque device handles, which must come back unchanged as the next call's past."""

        kind, notes = "resident", []
        inputs = [TensorSpec("hidden_states", "float32", ("batch", "sequence", 2)),
                  TensorSpec("past_k", "float32", ("batch", "past_sequence", 2))]
        outputs = [TensorSpec("hidden_states_out", "float32", ("batch", "sequence", 2)),
                   TensorSpec("present_k", "float32", ("batch", "total_sequence", 2))]

        def __init__(self):
            self.seen = []

        def run(self, feeds):
            raise AssertionError("a slot call must not go through run()")

        def run_resident(self, feeds, keep):
            self.seen.append(feeds["past_k"])
            assert keep == {"present_k"}
            return {"hidden_states_out": feeds["hidden_states"] * 2, "present_k": ("device", len(self.seen))}

        def close(self):
            pass

    session = Resident()
    stage = LocalStage(0, session, [], "cuda:0")
    h = np.ones((1, 1, 2), np.float32)
    out = stage.run({"hidden_states": h}, "s")
    assert set(out) == {"hidden_states_out"} and isinstance(session.seen[0], np.ndarray)
    stage.run({"hidden_states": h}, "s")
    assert session.seen[1] == ("device", 1)  # the previous present, untouched


def test_ray_missing_says_what_to_install(builds, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if the ray extra were not installed
    _checkpoint, out, _stages = builds["glm_moe_dsa", 3]
    np.save(tmp_path / "ids.npy", _prompt())
    result = _cli("generate", out, "--input-ids", tmp_path / "ids.npy", "--ray", "auto")
    assert result.exit_code == 1 and 'pip install "dsa-export[ray]"' in result.output
    assert "Traceback" not in result.output


class _Limited:
    """A one-stage decode model whose next token is always 3 and whose build holds 8 tokens per
    sequence (a test double of a build's profile limit)."""

    kind, notes = "limited", []
    inputs = [TensorSpec("input_ids", "int64", ("batch", "sequence")),
              TensorSpec("attention_mask", "int64", ("batch", "total_sequence")),
              TensorSpec("past_k", "float32", ("batch", "past_sequence", 2))]
    outputs = [TensorSpec("logits", "float32", ("batch", "sequence", 5)),
               TensorSpec("present_k", "float32", ("batch", "total_sequence", 2))]

    def sequence_limit(self):
        return 8

    def run(self, feeds):
        b, s = feeds["input_ids"].shape
        assert feeds["attention_mask"].shape[1] <= 8, "fed past the build's limit"
        logits = np.zeros((b, s, 5), np.float32)
        logits[..., 3] = 1
        return {"logits": logits, "present_k": np.concatenate([feeds["past_k"], np.zeros((b, s, 2))], 1)}

    def close(self):
        pass


def test_generate_stops_at_the_builds_limit_with_a_note():
    model = PipelineSession.of_session(_Limited())
    assert model.sequence_limit() == 8
    result = generate(model, np.zeros((2, 5), np.int64), SamplingSettings(max_new_tokens=10))
    # 5 prompt tokens + 3 fed back = 8 held; the 4th chosen token is never fed.
    assert result.tokens.shape == (2, 4)
    assert len(result.notes) == 1 and "stopped after 4 new tokens of the 10 asked" in result.notes[0]
    report = result.to_dict()
    assert report["tokens"] == [[3] * 4] * 2 and report["notes"] == result.notes
    assert not generate(model, np.zeros((1, 5), np.int64), SamplingSettings(max_new_tokens=4)).notes
    with pytest.raises(DSAUserError, match="the prompt has 9 tokens but this build holds at most 8"):
        generate(model, np.zeros((1, 9), np.int64), SamplingSettings(max_new_tokens=1))


def test_a_prompt_longer_than_the_build_is_refused_before_running(builds, tmp_path):
    _checkpoint, out, _stages = builds["deepseek_v32", 2]
    limit = PipelineSession.open(out, "onnxruntime")
    try:
        most = limit.sequence_limit()
    finally:
        limit.close()
    assert most is not None
    np.save(tmp_path / "ids.npy", np.ones((1, most + 1), np.int64))
    result = _cli("generate", out, "--input-ids", tmp_path / "ids.npy", "--json")
    assert result.exit_code == 1 and f"holds at most {most} per sequence" in result.output
    assert "Traceback" not in result.output


class _Bytes:
    """A byte-level decoder: ids are bytes, decoded as UTF-8 with U+FFFD for broken sequences."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_stream_flushes_an_incomplete_character_at_the_end():
    from dsa_export.runtime.generate import TextStream

    stream = TextStream(_Bytes(), np.array([list(b"ab")]))
    euro = list("€".encode())  # 3 bytes
    pieces = [stream.push([b])[0] for b in [ord("c"), *euro, euro[0]]]
    assert pieces == ["c", "", "", "€", ""]  # the last byte starts a character that never ends
    assert stream.flush() == ["\ufffd"]
    assert "".join(pieces) + "\ufffd" == stream.generated() == "c€\ufffd"
    assert stream.flush() == [""]


def test_generate_reads_the_prompt_from_a_file_or_stdin(builds, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    word_tokenizer(tokenizers, tmp_path / "tokenizer.json")
    _checkpoint, out, _stages = builds["deepseek_v32", 2]
    (tmp_path / "prompt.txt").write_text("w5 w17 w3 w99", encoding="utf-8")
    common = ["--tokenizer", tmp_path / "tokenizer.json", "--max-new-tokens", "3", "--json"]
    from_file = _cli("generate", out, "--prompt-file", tmp_path / "prompt.txt", *common)
    assert from_file.exit_code == 0, from_file.output
    from_arg = _cli("generate", out, "--prompt", "w5 w17 w3 w99", *common)
    want = json.loads(from_arg.stdout)
    got = json.loads(from_file.stdout)
    assert got["tokens"] == want["tokens"] and got["text"] == want["text"] and got["prompt_ids"] == [[5, 17, 3, 99]]
    import subprocess
    import sys

    piped = subprocess.run([sys.executable, "-m", "dsa_export", *(str(a) for a in ["generate", out, "--prompt-file",
                                                                                  "-", *common])],
                           input="w5 w17 w3 w99", capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["tokens"] == want["tokens"]
    both = _cli("generate", out, "--prompt", "w1", "--prompt-file", tmp_path / "prompt.txt")
    assert both.exit_code == 2 and "one of them" in both.output


def test_a_copied_build_says_its_checkpoint_is_gone(builds, tmp_path):
    checkpoint, out, _stages = builds["deepseek_v32", 2]
    from dsa_export.runtime.generate import recorded_checkpoint

    recorded = recorded_checkpoint(out)
    assert recorded is not None and recorded.resolve() == checkpoint.resolve()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    moved = tmp_path / "moved-checkpoint"
    shutil.copytree(checkpoint, moved)
    # The copy records the original checkpoint by path; pretend it was moved away.
    import dsa_export.runtime.generate as gen

    real = gen.recorded_checkpoint
    gone = tmp_path / "gone"
    result = None
    try:
        gen.recorded_checkpoint = lambda path, pipeline=None: gone  # type: ignore[assignment]
        result = _cli("generate", copy, "--prompt", "hello")
    finally:
        gen.recorded_checkpoint = real  # type: ignore[assignment]
    assert result.exit_code == 2
    assert f"was made from the checkpoint {gone}, which is not there any more" in result.output
    assert "--tokenizer" in result.output
