"""``dsa-export serve``: the real server on a loopback port, driven by the official ``openai`` client.

The oracle is transformers: every completion a tiny DeepSeek-V3.2 checkpoint's paged export
serves, alone or among 15 concurrent requests, must be the text ``generate(do_sample=False)``
gives that prompt (stopping at the checkpoint's end-of-sequence token as transformers does), and
its logprobs transformers' log-softmax of the same step's scores. A second server, with one
row and a queue of one, is pushed past its queue (429), has clients disconnect, and is stopped
with SIGTERM while requests are in flight (they finish, exit 0).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

KEY = "test-key-1234"
EOS = 1
#: A chat template in the checkpoint's tokenizer_config.json (w1 is the end-of-sequence token).
TEMPLATE = ("{% for m in messages %}w2 {{ m['role'] }} {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}w3 assistant{% endif %}")


def _tokenizer_files(folder) -> None:
    """A word-level tokenizer (token i is the word ``w{i}``, ``w1`` the special end-of-sequence
    token) and its tokenizer_config.json with a chat template."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(128)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.add_special_tokens([tokenizers.AddedToken("w1", special=True, single_word=True)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0", "eos_token": "w1",
        "chat_template": TEMPLATE}))


@pytest.fixture(scope="module")
def checkpoint_and_export(tmp_path_factory):
    from dsa_export.export import ExportSettings, export_model, save_model
    from dsa_export.hf.source import hf_reference
    from dsa_export.sources import resolve
    from tests.hf.conftest import make_checkpoint

    root = tmp_path_factory.mktemp("serve")
    checkpoint = make_checkpoint(root, "deepseek_v32", layers=3, index_topk=8)
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["eos_token_id"] == EOS
    _tokenizer_files(checkpoint)
    onnx = save_model(export_model(resolve(hf_reference(checkpoint, graph="paged")), ExportSettings()),
                      root / "paged.onnx")
    return checkpoint, onnx


class Server:
    """``dsa-export serve`` in a child process; ``url`` once its ready line is printed."""

    def __init__(self, artifact, *args):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dsa_export", "serve", str(artifact), "--port", "0", *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = self.process.stdout.readline()
        match = re.search(r"ready at (http://\S+/v1)", line)
        if match is None:
            self.process.kill()
            raise AssertionError(f"no ready line: {line!r}; stderr: {self.process.stderr.read()}")
        self.url = match.group(1)
        self.base = self.url[: -len("/v1")]

    def client(self, key: str = KEY, **options):
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120, **options)

    def metrics(self) -> dict[str, float]:
        text = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@pytest.fixture(scope="module")
def server(checkpoint_and_export):
    _checkpoint, onnx = checkpoint_and_export
    running = Server(onnx, "--max-batch", 16, "--max-model-len", 256, "--api-key", KEY,
                     "--served-model-name", "tiny-dsa", "--max-tokens-per-step", 64)
    yield running
    assert running.stop() == 0


def _prompts(count: int, seed: int = 5) -> list[list[int]]:
    """Prompts of different lengths (some past one 64-token page); ids 2.. (never the EOS)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 90, count)
    return [rng.integers(2, 128, n).tolist() for n in lengths]


def _text(ids) -> str:
    return " ".join(f"w{t}" for t in ids)


@pytest.fixture(scope="module")
def hf_model(checkpoint_and_export):
    checkpoint, _onnx = checkpoint_and_export
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()


def _hf(model, ids: list[int], new: int):
    """transformers' greedy tokens (stopping at the EOS, which they then include) and the
    log-softmax of each step's scores."""
    import torch

    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False,
                             eos_token_id=EOS, pad_token_id=EOS, output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    logprobs = [torch.log_softmax(score[0].double(), -1).numpy() for score in out.scores]
    return tokens, logprobs


@pytest.fixture(scope="module")
def hf_tokenizer(checkpoint_and_export):
    checkpoint, _onnx = checkpoint_and_export
    return transformers.AutoTokenizer.from_pretrained(checkpoint)


def _hf_text(tokenizer, tokens: list[int]) -> str:
    """The text of transformers' generated ids, as a transformers user decodes it."""
    return tokenizer.decode(tokens, skip_special_tokens=True)


def test_concurrent_completions_equal_transformers_greedy(server, hf_model, hf_tokenizer):
    prompts = _prompts(16)
    new = 12
    want = [_hf(hf_model, p, new)[0] for p in prompts]
    client = server.client()

    def complete(prompt):
        return client.completions.create(model="tiny-dsa", prompt=_text(prompt), max_tokens=new, temperature=0)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(complete, prompts))
    for prompt, answer, tokens in zip(prompts, answers, want):
        choice = answer.choices[0]
        assert choice.text == _hf_text(hf_tokenizer, tokens), prompt
        assert choice.finish_reason == ("stop" if EOS in tokens else "length")
        assert answer.usage.prompt_tokens == len(prompt)
        assert answer.usage.completion_tokens == len(tokens)
    # The same prompt alone gives the same text as among 15 others.
    alone = complete(prompts[7])
    assert alone.choices[0].text == answers[7].choices[0].text
    metrics = server.metrics()
    assert metrics["dsa_serve_kv_pages_in_use"] == 0
    assert metrics["dsa_serve_batch_size_sum"] > metrics["dsa_serve_batch_size_count"]  # rows were batched


def test_token_id_prompts_streaming_and_logprobs(server, hf_model, hf_tokenizer):
    prompt = _prompts(1, seed=11)[0]
    tokens, hf_logprobs = _hf(hf_model, prompt, 8)
    client = server.client()
    whole = client.completions.create(model="tiny-dsa", prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    assert whole.choices[0].text == _hf_text(hf_tokenizer, tokens)
    entries = whole.choices[0].logprobs
    assert len(entries.token_logprobs) == len(tokens)
    for step, (token, logprob, top) in enumerate(zip(tokens, entries.token_logprobs, entries.top_logprobs)):
        assert logprob == pytest.approx(hf_logprobs[step][token], abs=2e-3)
        assert top and next(iter(top)) == hf_tokenizer.decode([token])  # greedy: the chosen token is the most likely
        assert list(top.values()) == sorted(top.values(), reverse=True)
    stream = client.completions.create(model="tiny-dsa", prompt=prompt, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        else:
            usage = chunk.usage
    assert "".join(pieces) == whole.choices[0].text
    assert usage is not None and usage.completion_tokens == len(tokens) and usage.prompt_tokens == len(prompt)


def test_chat_completions_apply_the_template(server, hf_model, hf_tokenizer):
    tokenizer = hf_tokenizer
    messages = [{"role": "system", "content": "w4 w5"}, {"role": "user", "content": "w9 w10 w11"}]
    ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False).input_ids
    tokens, _ = _hf(hf_model, ids, 10)
    client = server.client()
    answer = client.chat.completions.create(model="tiny-dsa", messages=messages, max_tokens=10, temperature=0)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == _hf_text(hf_tokenizer, tokens)
    assert answer.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model="tiny-dsa", messages=messages, max_tokens=10, temperature=0,
                                            stream=True)
    deltas = [chunk.choices[0].delta for chunk in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == answer.choices[0].message.content


def test_stop_strings_and_sampling(server):
    client = server.client()
    prompt = _text(_prompts(1, seed=21)[0])
    free = client.completions.create(model="tiny-dsa", prompt=prompt, max_tokens=10, temperature=0).choices[0].text
    words = free.split()
    stop = " " + words[3]
    first = next(i for i, w in enumerate(words) if w == words[3])
    cut = client.completions.create(model="tiny-dsa", prompt=prompt, max_tokens=10, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == " ".join(words[:first])
    # A seed makes sampling repeatable; another seed (almost surely) samples something else.
    sampled = [client.completions.create(model="tiny-dsa", prompt=prompt, max_tokens=16, temperature=1.5, seed=seed,
                                         top_p=0.95).choices[0].text for seed in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]


def test_bad_requests_get_openai_errors(server):
    client = server.client()
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").completions.create(model="tiny-dsa", prompt="w5", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="another", prompt="w5", max_tokens=2)
    for options, param in (({"n": 2}, "n"), ({"temperature": 3}, "temperature"), ({"max_tokens": 0}, "max_tokens"),
                           ({"prompt": "w5 " * 300}, "prompt"), ({"max_tokens": 250, "prompt": "w5 " * 10},
                                                                 "max_tokens"),
                           ({"prompt": [5, 900]}, "prompt")):
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(**{"model": "tiny-dsa", "prompt": "w5", "max_tokens": 2, **options})
        body = error.value.body
        assert body["message"] and body["param"] == param, (options, body)
    # /health and /metrics need no key.
    assert json.loads(urllib.request.urlopen(server.base + "/health", timeout=10).read()) == {"status": "ok"}


def test_engine_failure_fails_that_calls_requests_and_keeps_serving(checkpoint_and_export):
    """A model call that raises fails the requests in it (500), frees their pages, and the next
    request is served (in process: a wrapper makes the third call raise)."""
    from dsa_export.runtime import load
    from dsa_export.serve.engine import Request, RequestParams, ServingEngine
    from dsa_export.serve.text import ServedTokenizer
    from dsa_export.stages.session import PipelineSession

    checkpoint, onnx = checkpoint_and_export
    model = PipelineSession.of_session(load(onnx, "onnxruntime"))
    calls = {"n": 0}
    forward = model.forward

    def flaky(feeds, slot, micro_batches=1):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("stage 0 lost its device")
        return forward(feeds, slot, micro_batches)

    model.forward = flaky
    model.forward_calls = lambda calls, slot: [flaky(feeds, slot) for feeds in calls]
    tokenizer = ServedTokenizer(checkpoint)
    engine = ServingEngine(model, tokenizer, eos_token_ids=(), max_batch=2, max_model_len=256)
    engine.start()
    try:
        def run(prompt):
            events, done = [], concurrent.futures.Future()

            def sink(event):
                events.append(event)
                if event.final:
                    done.set_result(event)

            engine.submit(Request(prompt, RequestParams(max_tokens=6), sink, tokenizer))
            return done.result(60), events

        failed, _ = run([5, 6, 7])
        assert failed.error is not None and failed.error.status == 500 and "lost its device" in failed.error.message
        assert not engine.healthy and model.pages.pages_in_use == 0
        ok, events = run([5, 6, 7])
        assert ok.error is None and ok.finish_reason == "length" and sum(len(e.tokens) for e in events) == 6
        assert engine.healthy and model.pages.pages_in_use == 0
    finally:
        engine.stop()
        model.close()


def test_queue_limit_disconnects_and_sigterm_drain(checkpoint_and_export):
    _checkpoint, onnx = checkpoint_and_export
    server = Server(onnx, "--max-batch", 1, "--max-queue", 1, "--max-model-len", 256)
    try:
        client = server.client(key="none")
        # A client that goes away mid-stream: its request is cancelled and its pages freed.
        stream = client.completions.create(model=None, prompt="w5 w6 w7", max_tokens=200, temperature=0, stream=True)
        for index, _chunk in enumerate(stream):
            if index == 2:
                break
        stream.close()
        deadline = time.monotonic() + 20
        while server.metrics()['dsa_serve_requests_total{outcome="cancelled"}'] < 1:
            assert time.monotonic() < deadline, "the disconnected request was never cancelled"
            time.sleep(0.1)
        assert server.metrics()["dsa_serve_kv_pages_in_use"] == 0

        # One runs, one waits, the rest are refused with 429 and Retry-After.
        raw = server.client(key="none").with_raw_response

        def ask(_):
            try:
                return raw.completions.create(model=None, prompt="w5 w6", max_tokens=150, temperature=0).parse()
            except openai.RateLimitError as exc:
                return exc

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            results = list(pool.map(ask, range(5)))
        refused = [r for r in results if isinstance(r, openai.RateLimitError)]
        served = [r for r in results if not isinstance(r, openai.RateLimitError)]
        assert refused and len(served) >= 2
        assert all(r.response.headers.get("retry-after") for r in refused)
        assert all(r.usage.completion_tokens == 150 for r in served)

        # SIGTERM with two requests in flight: both complete, then the server exits 0.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pending = []
            for _ in range(2):  # one after the other: the queue holds one request until it is admitted
                pending.append(pool.submit(client.completions.create, model=None, prompt="w8 w9", max_tokens=120,
                                           temperature=0))
                time.sleep(0.5)
            time.sleep(1.0)
            began = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            answers = [p.result(60) for p in pending]
            code = server.process.wait(15)
        assert code == 0, server.process.stderr.read()
        assert time.monotonic() - began < 15
        assert all(a.usage.completion_tokens == 120 for a in answers)
    finally:
        server.stop()


def test_cli_refusals_are_one_sentence(checkpoint_and_export, tmp_path):
    """A busy port and a graph that is not paged are refused in one sentence, exit 1, before
    anything listens."""
    import socket

    from dsa_export.errors import DSAUserError
    from dsa_export.serve.engine import ServingEngine
    from tests.stages.test_session import _cli

    _checkpoint, onnx = checkpoint_and_export
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        result = _cli("serve", onnx, "--port", busy.getsockname()[1])
    assert result.exit_code == 1
    assert "cannot listen on 127.0.0.1" in result.stderr and "Traceback" not in result.stderr

    class DecodeGraph:
        paged = False

    with pytest.raises(DSAUserError, match="needs a paged graph"):
        ServingEngine(DecodeGraph(), tokenizer=None)


def _started(pid: int) -> float:
    """Start time of a process, in clock ticks since boot (/proc/PID/stat field 22)."""
    with open(f"/proc/{pid}/stat") as f:
        return float(f.read().rsplit(")", 1)[1].split()[19])


def test_serving_stages_in_ray_actors_and_losing_one(checkpoint_and_export, hf_model, hf_tokenizer, tmp_path):
    """``serve STAGES --ray auto``: ragged concurrent prompts get transformers' text; when a stage's
    actor process is killed, the request in flight gets 503 and the server exits 1 in one sentence."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from tests.stages.test_session import _cli

    checkpoint, _onnx = checkpoint_and_export
    stages = tmp_path / "stages"
    result = _cli("export", checkpoint, "--stages", 2, "--graph", "paged", "-o", stages)
    assert result.exit_code == 0, result.output
    with open("/proc/self/stat") as f:
        began = float(f.read().rsplit(")", 1)[1].split()[19])
    server = Server(stages, "--ray", "auto", "--max-model-len", 1024, "--micro-batches", 2)
    try:
        client = server.client(key="none")
        prompts = _prompts(4, seed=8)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda p: client.completions.create(model=None, prompt=p, max_tokens=8,
                                                                          temperature=0), prompts))
        for prompt, answer in zip(prompts, answers):
            assert answer.choices[0].text == _hf_text(hf_tokenizer, _hf(hf_model, prompt, 8)[0])

        actors = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).startswith("ray::_StageActor")
                  and _started(int(pid)) >= began]
        assert len(actors) == 2, actors
        failure: list[BaseException] = []

        def long_request():
            try:
                client.completions.create(model=None, prompt=[5, 6, 7], max_tokens=1000, temperature=0,
                                          extra_body={"ignore_eos": True})
            except openai.APIStatusError as exc:
                failure.append(exc)

        worker = concurrent.futures.ThreadPoolExecutor(1)
        pending = worker.submit(long_request)
        time.sleep(1.5)
        os.kill(max(actors), signal.SIGKILL)
        pending.result(60)
        worker.shutdown()
        assert failure and failure[0].status_code == 503 and "Ray actor died" in failure[0].message
        code = server.process.wait(30)
        stderr = server.process.stderr.read()
        assert code == 1, stderr
        assert "Error: serve stopped (the requests in flight were answered with 503): stage " in stderr
        assert "Traceback" not in stderr
    finally:
        server.stop()


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
