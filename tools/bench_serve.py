#!/usr/bin/env python3
"""Load on an OpenAI-compatible completions endpoint: time to first token, time per output token,
latency and throughput under concurrency, with soak options (disconnects, server RSS, /metrics).

    python tools/bench_serve.py --url http://127.0.0.1:8000/v1 --requests 64 --concurrency 16 \\
        --prompt-len lognormal:512:1:4096 --max-tokens uniform:16:256 --vocab 32000 \\
        [--sequential] [--disconnect-rate 0.3] [--random-order] [--server-pid PID] [--json-out FILE]

Sends ``--requests`` streamed completions through ``openai.AsyncOpenAI``, at most ``--concurrency``
in flight, every one with ``temperature=0``, ``stream=True`` and ``stream_options={"include_usage":
true}``. Prompts are lists of random token ids in [--min-id, --vocab) (the completions endpoint
takes ``prompt`` as a list of ints; --vocab at most the model's vocabulary), so prompt lengths are
exact whatever the server's tokenizer. Prompt and answer lengths are drawn from ``const:K``,
``uniform:LO:HI`` (both ends included) or ``lognormal:MEDIAN:SIGMA:MAX`` (rounded, clipped to
[1, MAX]); everything is drawn from --seed. Per request: time to first token (the first chunk with
non-empty text), time per output token ((end - first token) / (completion tokens - 1)),
end-to-end latency, and completion tokens (from the usage chunk, else the chunks counted).
Reported: requests ok / failed (by HTTP status or kind) / disconnected on purpose, wall time,
output tokens/s (tokens of the complete answers plus the chunks the disconnected ones received,
over the wall time), complete requests/s, and p50 / p90 / p99 of the three times over the complete
answers (read the medians). The driver is one Python process and the client spends about 0.2 ms
of its CPU per streamed chunk: its CPU share is printed, and near 100 % the client, not the
server, bounds the figures (at some 4000 tokens/s).

--sequential sends the same requests (same prompts, max tokens and disconnect points, same order)
again one at a time and reports concurrent wall / sequential wall (its inverse is the speed-up
that batching gives). Soak options: --disconnect-rate P makes that fraction of requests close
their stream, and with it their HTTP connection, after a random 1..k chunks (k = the
request's max tokens - 1, or --disconnect-max-chunks), so that the server sees clients go away;
--random-order sends the requests in a random permutation instead of as drawn; --server-pid PID
samples that process's VmRSS (/proc/PID/status) after every request and reports it after warm-up
(the first 10 % of the concurrent requests), at the end and at its maximum. Before and after the
run, ``{--url without /v1}/metrics`` is read if it answers (Prometheus text) and the series in
SERIES below are reported; after the run it is polled for up to --settle seconds until no request
is running or queued.

Exit status: 0 when every request that was not disconnected on purpose got a complete answer (a
finish_reason and no error), 1 otherwise (the failures are listed), 2 on bad arguments. Figures are
from one run against a live server: compare runs made the same way, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx2
import numpy as np
import openai

#: The server's series reported before and after the run (every label set of each).
SERIES = ("dsa_serve_kv_pages_in_use", "dsa_serve_running_requests", "dsa_serve_queue_length",
          "dsa_serve_requests_total", "dsa_serve_generation_tokens_total")
#: Gauges that read 0 once the server is idle: the after-run read waits for them (--settle).
BUSY_SERIES = ("dsa_serve_running_requests", "dsa_serve_queue_length")
PERCENTILES = (50, 90, 99)
MIB = 2**20


# ---------------------------------------------------------------------------------------------
# Lengths and the plan of requests.

class Lengths:
    """Token counts drawn from ``const:K``, ``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA:MAX``."""

    def __init__(self, spec: str):
        self.spec = spec
        kind, _, rest = spec.partition(":")
        parts = rest.split(":") if rest else []
        shapes = {"const": 1, "uniform": 2, "lognormal": 3}
        if kind not in shapes or len(parts) != shapes[kind]:
            raise argparse.ArgumentTypeError(
                f"{spec!r} is not a length distribution: give const:K, uniform:LO:HI or "
                f"lognormal:MEDIAN:SIGMA:MAX")
        try:
            numbers = [float(p) if kind == "lognormal" and i == 1 else int(p) for i, p in enumerate(parts)]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{spec!r}: the lengths must be whole numbers (and SIGMA a number)") from None
        self.kind, self.params = kind, numbers
        if kind == "const" and numbers[0] < 1:
            raise argparse.ArgumentTypeError(f"{spec!r}: K must be at least 1")
        if kind == "uniform" and not 1 <= numbers[0] <= numbers[1]:
            raise argparse.ArgumentTypeError(f"{spec!r}: need 1 <= LO <= HI")
        if kind == "lognormal" and not (1 <= numbers[0] <= numbers[2] and 0 <= numbers[1] < math.inf):
            raise argparse.ArgumentTypeError(f"{spec!r}: need 1 <= MEDIAN <= MAX and SIGMA >= 0")

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        if self.kind == "const":
            return [self.params[0]] * n
        if self.kind == "uniform":
            return rng.integers(self.params[0], self.params[1] + 1, n).tolist()
        median, sigma, top = self.params
        values = np.rint(rng.lognormal(math.log(median), sigma, n))
        return np.clip(values, 1, top).astype(int).tolist()

    def __str__(self) -> str:
        return self.spec


@dataclass
class Planned:
    index: int
    prompt: list[int]
    max_tokens: int
    disconnect_after: int | None  # text chunks after which the client closes the stream


def make_plan(args) -> tuple[list[Planned], list[int]]:
    """The requests, drawn from --seed, and the order in which to send them."""
    rng = np.random.default_rng(args.seed)
    n = args.requests
    prompt_lens = args.prompt_len.draw(rng, n)
    max_tokens = args.max_tokens.draw(rng, n)
    prompts = [rng.integers(args.min_id, args.vocab, length).tolist() for length in prompt_lens]
    cut = set(rng.choice(n, size=round(args.disconnect_rate * n), replace=False).tolist())
    plan = []
    for i in range(n):
        after = None
        if i in cut:
            k = max(1, max_tokens[i] - 1)
            if args.disconnect_max_chunks:
                k = min(k, args.disconnect_max_chunks)
            after = int(rng.integers(1, k + 1))
        plan.append(Planned(i, prompts[i], max_tokens[i], after))
    order = rng.permutation(n).tolist() if args.random_order else list(range(n))
    return plan, order


# ---------------------------------------------------------------------------------------------
# One request.

@dataclass
class Outcome:
    index: int
    prompt_tokens: int
    max_tokens: int
    disconnect_after: int | None
    status: str = "failed"  # "ok", "disconnected" (on purpose) or "failed"
    error_kind: str | None = None  # "HTTP 503", "timeout", "connection", "stream error", "incomplete"
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float | None = None
    completion_tokens: int = 0
    tokens_from: str | None = None  # "usage" or "chunks"
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    chunks: int = 0  # chunks that carried a choice

    @classmethod
    def of(cls, req: Planned) -> Outcome:
        return cls(req.index, len(req.prompt), req.max_tokens, req.disconnect_after)


async def stream_one(client: openai.AsyncOpenAI, model: str, req: Planned, out: Outcome) -> None:
    """Send ``req`` and fill ``out`` as the chunks arrive; the stream is closed on every way out."""
    began = time.perf_counter()
    first_text = first_choice = None
    usage = None
    stream = None
    try:
        # The prompt rides in extra_body, which the client merges into the JSON body as it is: its
        # parameter transform walks a `prompt` list id by id (~70 ms of CPU for 8k ids, on the event
        # loop that every stream's timestamps share).
        stream = await client.completions.create(
            model=model, prompt=[], max_tokens=req.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"prompt": req.prompt})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            out.chunks += 1
            choice = chunk.choices[0]
            first_choice = first_choice or now
            if first_text is None and choice.text:
                first_text = now
            if choice.finish_reason:
                out.finish_reason = choice.finish_reason
            elif req.disconnect_after is not None and out.chunks >= req.disconnect_after:
                out.status = "disconnected"
                break  # the finally below closes the response: the server sees the client go away
        end = time.perf_counter()
    except openai.APIStatusError as exc:
        out.error_kind, out.error = f"HTTP {exc.status_code}", _brief(exc.message)
        return
    except openai.APITimeoutError:
        out.error_kind, out.error = "timeout", "the HTTP client timed out (--timeout)"
        return
    except openai.APIConnectionError as exc:
        out.error_kind, out.error = "connection", _brief(str(exc.__cause__ or exc))
        return
    except openai.APIError as exc:  # an error event inside the stream
        out.error_kind, out.error = "stream error", _brief(exc.message)
        return
    except (ValueError, TypeError, KeyError) as exc:  # a chunk that is not a completion chunk
        out.error_kind, out.error = "bad chunk", _brief(f"{type(exc).__name__}: {exc}")
        return
    finally:
        if stream is not None:
            await stream.close()
    first = first_text or first_choice
    out.ttft_s = first - began if first is not None else None
    out.latency_s = end - began
    if usage is not None and usage.completion_tokens is not None and out.status != "disconnected":
        out.completion_tokens, out.tokens_from = int(usage.completion_tokens), "usage"
        out.usage_prompt_tokens = usage.prompt_tokens
    else:
        out.completion_tokens, out.tokens_from = out.chunks, "chunks"
    if out.status == "disconnected":
        return
    if out.finish_reason is None:
        out.error_kind = "incomplete"
        out.error = f"the stream ended after {out.chunks} chunks without a finish_reason"
        return
    out.status = "ok"
    if first is not None and out.completion_tokens > 1:
        out.tpot_s = (end - first) / (out.completion_tokens - 1)


def _brief(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Server RSS and /metrics.

class RssSampler:
    """VmRSS of one process, read from /proc/PID/status after every request."""

    def __init__(self, pid: int):
        self.pid = pid
        self.samples: list[tuple[float, int | None]] = []  # (seconds since the start, bytes)
        self.began = time.perf_counter()
        self.marks: dict[str, int | None] = {}

    def read(self) -> int | None:
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def sample(self) -> int | None:
        value = self.read()
        self.samples.append((time.perf_counter() - self.began, value))
        return value

    def report(self) -> dict:
        values = [v for _, v in self.samples if v is not None]
        end = self.samples[-1][1] if self.samples else None
        warm = self.marks.get("warm_up")
        return {"pid": self.pid, "before_bytes": self.marks.get("before"), "warm_up_bytes": warm,
                "warm_up_requests": self.marks.get("warm_up_requests"), "end_bytes": end,
                "max_bytes": max(values) if values else None,
                "growth_after_warm_up_bytes": end - warm if end is not None and warm is not None else None,
                "gone": bool(self.samples) and end is None,
                "samples": [[round(t, 3), v] for t, v in self.samples]}


def parse_prometheus(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line of a Prometheus text exposition."""
    values: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        i = 0
        while i < len(line) and line[i] not in "{ \t":
            i += 1
        key = line[:i]
        if i < len(line) and line[i] == "{":
            j, quoted = i + 1, False
            while j < len(line):
                c = line[j]
                if quoted and c == "\\":
                    j += 1
                elif c == '"':
                    quoted = not quoted
                elif c == "}" and not quoted:
                    break
                j += 1
            key, i = key + line[i:j + 1], j + 1
        fields = line[i:].split()
        if not key or not fields:
            continue
        try:
            values[key] = float(fields[0])
        except ValueError:
            continue
    return values


async def read_metrics(url: str) -> dict[str, float] | None:
    """The SERIES samples of ``url``, or None when it does not answer with 200."""
    try:
        async with httpx2.AsyncClient(timeout=10) as http:
            response = await http.get(url)
    except httpx2.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return {k: v for k, v in parse_prometheus(response.text).items() if k.partition("{")[0] in SERIES}


async def settled_metrics(url: str, settle_s: float) -> tuple[dict[str, float] | None, float, bool]:
    """/metrics after the run: polled until nothing runs or queues, or ``settle_s`` has passed."""
    began = time.perf_counter()
    while True:
        values = await read_metrics(url)
        waited = time.perf_counter() - began
        busy = values is not None and any(
            v for k, v in values.items() if k.partition("{")[0] in BUSY_SERIES)
        if not busy or waited >= settle_s:
            return values, waited, not busy
        await asyncio.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# Passes and figures.

async def run_pass(client, model: str, plan: list[Planned], order: list[int], concurrency: int,
                   timeout: float, on_done, label: str) -> tuple[list[Outcome], float, float]:
    """Every request of ``plan`` in ``order``, at most ``concurrency`` at once: outcomes in plan
    order, wall seconds and this process's CPU seconds."""
    semaphore = asyncio.Semaphore(concurrency)
    done = [0, 0]  # requests done, failed
    step = max(1, len(order) // 10)

    async def bounded(req: Planned) -> Outcome:
        async with semaphore:
            out = Outcome.of(req)
            try:
                await asyncio.wait_for(stream_one(client, model, req, out), timeout)
            except asyncio.TimeoutError:
                out.status, out.error_kind = "failed", "timeout"
                out.error = f"no complete answer within {timeout:g} s (--timeout)"
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                out.status, out.error_kind = "failed", "client error"
                out.error = _brief(f"{type(exc).__name__}: {exc}")
            done[0] += 1
            done[1] += out.status == "failed"
            on_done(out)
            if done[0] % step == 0 or done[0] == len(order):
                print(f"  {label}: {done[0]}/{len(order)} done, {done[1]} failed", file=sys.stderr,
                      flush=True)
            return out

    cpu, began = time.process_time(), time.perf_counter()
    outcomes = await asyncio.gather(*(bounded(plan[i]) for i in order))
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    return sorted(outcomes, key=lambda o: o.index), wall, cpu


def percentiles(values: list[float]) -> dict | None:
    if not values:
        return None
    row = {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}
    row.update(mean=float(np.mean(values)), n=len(values))
    return row


def summarize(outcomes: list[Outcome], wall: float, cpu: float) -> dict:
    ok = [o for o in outcomes if o.status == "ok"]
    cut = [o for o in outcomes if o.status == "disconnected"]
    failed = [o for o in outcomes if o.status == "failed"]
    by_kind: dict[str, int] = {}
    for o in failed:
        by_kind[o.error_kind or "?"] = by_kind.get(o.error_kind or "?", 0) + 1
    tokens = sum(o.completion_tokens for o in ok) + sum(o.completion_tokens for o in cut)
    return {
        "requests": len(outcomes), "ok": len(ok), "failed": len(failed), "failed_by_kind": by_kind,
        "disconnected": len(cut),
        "planned_disconnects_completed": sum(1 for o in ok if o.disconnect_after is not None),
        "wall_s": wall, "client_cpu_s": cpu, "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall if wall > 0 else None,
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "ttft_s": percentiles([o.ttft_s for o in ok if o.ttft_s is not None]),
        "tpot_s": percentiles([o.tpot_s for o in ok if o.tpot_s is not None]),
        "latency_s": percentiles([o.latency_s for o in ok if o.latency_s is not None]),
        "tokens_from_chunks": sum(1 for o in ok if o.tokens_from == "chunks"),
        "usage_prompt_tokens_mismatch": [o.index for o in ok if o.usage_prompt_tokens is not None
                                         and o.usage_prompt_tokens != o.prompt_tokens],
        "short_length_answers": [o.index for o in ok if o.finish_reason == "length"
                                 and o.completion_tokens != o.max_tokens],
    }


def _ms(row: dict | None) -> str:
    if row is None:
        return "-"
    return "  ".join(f"p{p} {row[f'p{p}'] * 1e3:9.2f} ms" for p in PERCENTILES)


def print_pass(name: str, s: dict) -> None:
    kinds = ", ".join(f"{k}: {n}" for k, n in sorted(s["failed_by_kind"].items()))
    print(f"{name}: {s['ok']} ok, {s['failed']} failed{f' ({kinds})' if kinds else ''}, "
          f"{s['disconnected']} disconnected on purpose, wall {s['wall_s']:.3f} s")
    cpu_share = 100 * s["client_cpu_s"] / s["wall_s"] if s["wall_s"] > 0 else 0.0
    print(f"  output {s['output_tokens_per_s'] or 0.0:.1f} tok/s ({s['output_tokens']} tokens), "
          f"{s['requests_per_s'] or 0.0:.2f} req/s, client CPU {cpu_share:.0f} % of wall")
    print(f"  TTFT     {_ms(s['ttft_s'])}")
    print(f"  TPOT     {_ms(s['tpot_s'])}")
    print(f"  latency  {_ms(s['latency_s'])}")
    notes = []
    if s["tokens_from_chunks"]:
        notes.append(f"{s['tokens_from_chunks']} answers without a usage chunk "
                     f"(their tokens counted as chunks)")
    if s["usage_prompt_tokens_mismatch"]:
        notes.append(f"usage.prompt_tokens differs from the prompt sent in requests "
                     f"{_ids(s['usage_prompt_tokens_mismatch'])}")
    if s["short_length_answers"]:
        notes.append(f"finish_reason 'length' before max_tokens in requests "
                     f"{_ids(s['short_length_answers'])}")
    if s["planned_disconnects_completed"]:
        notes.append(f"{s['planned_disconnects_completed']} planned disconnects finished first "
                     f"(counted ok)")
    for note in notes:
        print(f"  note: {note}")


def _ids(indices: list[int], shown: int = 8) -> str:
    text = ", ".join(str(i) for i in indices[:shown])
    return text + (f" (+{len(indices) - shown} more)" if len(indices) > shown else "")


def print_metrics(url: str, before: dict | None, after: dict | None, waited: float, idle: bool) -> None:
    if before is None and after is None:
        print(f"metrics: {url} did not answer")
        return
    state = "no request running or queued" if idle else "requests still running or queued"
    print(f"metrics ({url}; 'after' read {waited:.1f} s after the run: {state}):")
    keys = sorted(set(before or {}) | set(after or {}))
    if not keys:
        print("  none of the dsa_serve_* series")
    width = max((len(k) for k in keys), default=0)
    for key in keys:
        b, a = (before or {}).get(key), (after or {}).get(key)
        change = ("+" if a >= b else "") + _num(a - b) if a is not None and b is not None else ""
        print(f"  {key:<{width}}  before {_num(b):>12}  after {_num(a):>12}  {change}")


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{int(value)}" if value.is_integer() else f"{value:.6g}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f} MiB"


def describe_load(args, plan: list[Planned]) -> str:
    prompts = [len(r.prompt) for r in plan]
    answers = [r.max_tokens for r in plan]
    cuts = sum(r.disconnect_after is not None for r in plan)
    return (f"{args.requests} requests, concurrency {args.concurrency}, prompt {args.prompt_len} "
            f"(mean {np.mean(prompts):.1f}, max {max(prompts)}), max tokens {args.max_tokens} "
            f"(mean {np.mean(answers):.1f}, max {max(answers)}), ids in [{args.min_id}, {args.vocab}), "
            f"seed {args.seed}" + (f", {cuts} planned disconnects" if cuts else "")
            + (", random order" if args.random_order else ""))


# ---------------------------------------------------------------------------------------------

async def bench(args) -> int:
    base = args.url.rstrip("/")
    metrics_url = base.removesuffix("/v1") + "/metrics"
    connections = args.concurrency + 4  # one per request in flight, kept alive between requests
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    http = openai.DefaultAsyncHttpxClient(limits=limits, timeout=args.timeout)
    client = openai.AsyncOpenAI(base_url=base, api_key=args.api_key, max_retries=0,
                                timeout=args.timeout, http_client=http)
    async with client:
        model = args.model
        if model is None:
            try:
                models = (await client.models.list()).data
            except openai.APIError as exc:
                print(f"error: could not list the models at {base}/models ({_brief(str(exc))}); "
                      f"is the server up? (or pass --model)", file=sys.stderr)
                return 1
            if not models:
                print(f"error: {base}/models lists no model; pass --model", file=sys.stderr)
                return 1
            model = models[0].id
        plan, order = make_plan(args)
        rss = RssSampler(args.server_pid) if args.server_pid is not None else None
        if rss is not None:
            rss.marks["before"] = rss.sample()
        warm_up = max(1, math.ceil(args.requests / 10))
        finished = [0]

        def on_done(out: Outcome) -> None:
            finished[0] += 1
            if rss is not None:
                value = rss.sample()
                if finished[0] == warm_up:
                    rss.marks.update(warm_up=value, warm_up_requests=warm_up)

        print(f"target: {base}, model {model}")
        print(f"load: {describe_load(args, plan)}", flush=True)
        before = await read_metrics(metrics_url)

        outcomes, wall, cpu = await run_pass(client, model, plan, order, args.concurrency, args.timeout,
                                             on_done, "concurrent")
        settings = {k: str(v) if isinstance(v, (Lengths, Path)) else v
                    for k, v in vars(args).items() if k != "api_key"}
        report: dict = {"target": {"url": base, "model": model, "metrics_url": metrics_url},
                        "load": settings, "concurrent": summarize(outcomes, wall, cpu)}
        passes = {"concurrent": outcomes}
        if args.sequential:
            seq, seq_wall, seq_cpu = await run_pass(client, model, plan, order, 1, args.timeout, on_done,
                                                    "sequential")
            passes["sequential"] = seq
            report["sequential"] = summarize(seq, seq_wall, seq_cpu)
            report["concurrent_over_sequential_wall"] = wall / seq_wall if seq_wall > 0 else None
        after, waited, idle = await settled_metrics(metrics_url, args.settle)
        report["metrics"] = {"before": before, "after": after, "after_read_s": waited, "idle_after": idle}
        if rss is not None:
            report["rss"] = rss.report()
        report["requests"] = {name: [asdict(o) for o in outs] for name, outs in passes.items()}

    print()
    print_pass("concurrent", report["concurrent"])
    if args.sequential:
        print_pass("sequential", report["sequential"])
        ratio = report["concurrent_over_sequential_wall"]
        if ratio:
            print(f"concurrent wall / sequential wall: {ratio:.3f} (batching {1 / ratio:.2f}x faster)")
    print_metrics(metrics_url, before, after, waited, idle)
    if rss is not None:
        r = report["rss"]
        growth = r["growth_after_warm_up_bytes"]
        print(f"server RSS (pid {r['pid']}): before {_mib(r['before_bytes'])}, after warm-up "
              f"({r['warm_up_requests']} requests) {_mib(r['warm_up_bytes'])}, end {_mib(r['end_bytes'])}"
              + (f" ({growth / MIB:+.1f} MiB since warm-up)" if growth is not None else "")
              + f", max {_mib(r['max_bytes'])}" + (" - the process is gone" if r["gone"] else ""))
    failures = [(name, o) for name, outs in passes.items() for o in outs if o.status == "failed"]
    if failures:
        print(f"FAILED: {len(failures)} requests without a complete answer:")
        for name, o in failures[:10]:
            print(f"  {name} request {o.index} (prompt {o.prompt_tokens}, max_tokens {o.max_tokens}): "
                  f"{o.error_kind}: {o.error}")
        if len(failures) > 10:
            print(f"  ... and {len(failures) - 10} more (see --json-out)")
    report["exit_status"] = 1 if failures else 0
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))
    return report["exit_status"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_argument_group("target")
    target.add_argument("--url", default="http://127.0.0.1:8000/v1",
                        help="base URL of the API (default: %(default)s)")
    target.add_argument("--model", default=None,
                        help="model name (default: the first id of GET /v1/models)")
    target.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or "none",
                        help="bearer key (default: $OPENAI_API_KEY, else 'none')")
    target.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a request may take, from when it is sent (default: %(default)s)")
    load = parser.add_argument_group("load")
    load.add_argument("--requests", type=int, default=16, help="number of requests (default: %(default)s)")
    load.add_argument("--concurrency", type=int, default=16,
                      help="requests in flight at most (default: %(default)s)")
    load.add_argument("--prompt-len", type=Lengths, default=Lengths("const:128"), metavar="DIST",
                      help="prompt tokens: const:K, uniform:LO:HI or lognormal:MEDIAN:SIGMA:MAX "
                           "(default: const:128)")
    load.add_argument("--max-tokens", type=Lengths, default=Lengths("const:64"), metavar="DIST",
                      help="max_tokens of each request, same forms (default: const:64)")
    load.add_argument("--vocab", type=int, default=1000,
                      help="prompt ids are below this, at most the model's vocabulary (default: %(default)s)")
    load.add_argument("--min-id", type=int, default=2,
                      help="prompt ids are at least this (default: %(default)s)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--sequential", action="store_true",
                      help="also send the same requests one at a time and compare the wall times")
    soak = parser.add_argument_group("soak")
    soak.add_argument("--disconnect-rate", type=float, default=0.0, metavar="P",
                      help="fraction of requests whose client closes the stream early (default: 0)")
    soak.add_argument("--disconnect-max-chunks", type=int, default=None, metavar="K",
                      help="disconnect after at most K chunks (default: the request's max tokens - 1)")
    soak.add_argument("--random-order", action="store_true", help="send the requests in a random order")
    soak.add_argument("--server-pid", type=int, default=None, metavar="PID",
                      help="sample this process's VmRSS after every request")
    soak.add_argument("--settle", type=float, default=5.0, metavar="S",
                      help="after the run, wait up to S seconds for /metrics to show no running or "
                           "queued request (default: %(default)s)")
    parser.add_argument("--json-out", type=Path, default=None, metavar="FILE",
                        help="also write everything here (JSON)")
    args = parser.parse_args(argv)

    if args.requests < 1:
        parser.error("--requests must be at least 1")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if not 0 <= args.min_id < args.vocab:
        parser.error(f"need 0 <= --min-id < --vocab (got [{args.min_id}, {args.vocab}))")
    if not 0.0 <= args.disconnect_rate <= 1.0:
        parser.error("--disconnect-rate must be between 0 and 1")
    if args.disconnect_max_chunks is not None and args.disconnect_max_chunks < 1:
        parser.error("--disconnect-max-chunks must be at least 1")
    if not args.timeout > 0:
        parser.error("--timeout must be positive")
    if args.settle < 0:
        parser.error("--settle must not be negative")
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"--url must be an http:// or https:// URL (got {args.url!r})")
    if args.server_pid is not None and not os.path.exists(f"/proc/{args.server_pid}/status"):
        parser.error(f"--server-pid {args.server_pid}: no such process (no /proc/{args.server_pid}/status)")
    if args.json_out is not None and not args.json_out.parent.is_dir():
        parser.error(f"--json-out {args.json_out}: the folder {args.json_out.parent} does not exist")
    try:
        return asyncio.run(bench(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
