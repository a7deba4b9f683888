"""The server's figures in Prometheus' text format (``GET /metrics``).

Counters: requests by outcome (``completed``, ``cancelled``: the client went away, ``failed``,
``rejected``: the queue was full), prompt and generated tokens, model calls. Gauges: requests
waiting and running, cache pages in use, touched (what the pools grew to) and in all, the
process' resident memory. Histograms: time to first token, time per output token, rows and tokens
per model call, seconds per call.
Written by the scheduler thread, read by the HTTP front: one lock.
"""

from __future__ import annotations

import os
import threading

PREFIX = "dsa_serve_"

#: Histogram bucket upper bounds.
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)


class Histogram:
    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class ServeMetrics:
    """See the module docstring."""

    OUTCOMES = ("completed", "cancelled", "failed", "rejected")

    def __init__(self):
        self._lock = threading.Lock()
        self.requests = dict.fromkeys(self.OUTCOMES, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.calls = 0
        self.waiting = 0
        self.running = 0
        self.pages_in_use = 0
        self.pages_touched = 0
        self.pages_total = 0
        self.ttft = Histogram(SECONDS)
        self.tpot = Histogram(SECONDS)
        self.call_seconds = Histogram(SECONDS)
        self.call_rows = Histogram(ROWS)
        self.call_tokens = Histogram(TOKENS)

    def request_done(self, outcome: str) -> None:
        with self._lock:
            self.requests[outcome] += 1

    def count_tokens(self, prompt: int = 0, generated: int = 0) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated

    def set_queue(self, waiting: int, running: int) -> None:
        with self._lock:
            self.waiting, self.running = waiting, running

    def set_pages(self, in_use: int, touched: int) -> None:
        with self._lock:
            self.pages_in_use = in_use
            self.pages_touched = touched

    def set_capacity(self, pages: int) -> None:
        with self._lock:
            self.pages_total = pages

    def observe_call(self, rows: int, tokens: int, seconds: float) -> None:
        with self._lock:
            self.calls += 1
            self.call_rows.observe(rows)
            self.call_tokens.observe(tokens)
            self.call_seconds.observe(seconds)

    def observe_first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_per_token(self, seconds: float) -> None:
        with self._lock:
            self.tpot.observe(seconds)

    def render(self) -> str:
        p = PREFIX
        with self._lock:
            lines = [f"# HELP {p}requests_total Requests that ended, by outcome.", f"# TYPE {p}requests_total counter"]
            lines += [f'{p}requests_total{{outcome="{k}"}} {v}' for k, v in self.requests.items()]
            for name, value, kind, text in (
                    ("prompt_tokens_total", self.prompt_tokens, "counter", "Prompt tokens of ended requests."),
                    ("generation_tokens_total", self.generation_tokens, "counter", "Tokens generated."),
                    ("model_calls_total", self.calls, "counter", "Calls of the model (decode and prefill)."),
                    ("queue_length", self.waiting, "gauge", "Requests waiting to start."),
                    ("running_requests", self.running, "gauge", "Requests in the running batch."),
                    ("kv_pages_in_use", self.pages_in_use, "gauge", "Cache pages held by requests."),
                    ("kv_pages_total", self.pages_total, "gauge", "Cache pages requests may hold."),
                    ("kv_pages_touched", self.pages_touched, "gauge",
                     "Pages ever handed out (scratch page included): what the pools grew to hold."),
                    ("process_resident_memory_bytes", _rss(), "gauge", "Resident memory of the server process.")):
                lines += [f"# HELP {p}{name} {text}", f"# TYPE {p}{name} {kind}", f"{p}{name} {value}"]
            for name, histogram, text in (
                    ("time_to_first_token_seconds", self.ttft, "From arrival to the first generated token."),
                    ("time_per_output_token_seconds", self.tpot, "Mean time per generated token after the first."),
                    ("model_call_seconds", self.call_seconds,
                     "Seconds per model call (calls submitted together each count their group's time)."),
                    ("batch_size", self.call_rows, "Rows (requests) per model call."),
                    ("tokens_per_call", self.call_tokens, "Tokens fed per model call.")):
                lines += [f"# HELP {p}{name} {text}", f"# TYPE {p}{name} histogram", *histogram.lines(p + name)]
        return "\n".join(lines) + "\n"


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


__all__ = ["Histogram", "ServeMetrics"]
