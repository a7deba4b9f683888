"""Continuous batching over a paged pipeline: :class:`ServingEngine`.

One scheduler thread owns the model (a :class:`~dsa_export.stages.session.PipelineSession` over
paged graphs: a single export, a stage export or stage build, local or on Ray) and its page
allocator. Requests join and leave at any step:

* **Admission.** A request is admitted (FIFO) when the batch has room (``max_batch`` rows) and the
  cache pools have room for its whole life: the pages of ``prompt + max_tokens - 1`` tokens are
  reserved when it starts, so a running request can never run out of pages (no preemption is
  needed). The waiting queue holds at most ``max_queue`` requests; past that :meth:`submit`
  refuses (the HTTP front answers 429 with Retry-After).
* **A step** is a decode call with one token for every running request past its prompt (cut into
  ``micro_batches`` calls), then one prefill call with the next chunk of the prompts still being
  read, FIFO, within the step's token budget (``max_tokens_per_step`` minus the decode rows). The
  calls are submitted together: on a pipeline of several stages they overlap (stage ``i`` runs the
  next call while stage ``i + 1`` runs the one before; they touch different pages). The
  graph takes ``[rows, width]`` tokens and computes the padding too, so the budget counts
  ``rows x width``: the oldest reading request sets the width, others join while that fits. A
  decode row is never put in a prefill call (it would be padded to the chunk's width).
* **After each call** every row whose prompt is complete gets its next token (its own sampling
  settings and seeded generator: greedy results do not depend on what else is in the batch),
  its text delta (stop strings are searched there; text that may be the start of a stop string is
  held back until it cannot be) and, when it ends (end-of-sequence id, ``max_tokens``, a stop
  string, the build's sequence limit), its pages go back to the allocator at once.
* **Cancelled** requests (the client went away) leave at the start of the next step, pages freed.
* **Failures.** A call that raises fails the requests of that call (500), frees their pages, and
  the engine goes on serving; :attr:`healthy` is False until a later call succeeds. A stage that
  is gone for good (:class:`~dsa_export.stages.session.StageLostError`: its Ray actor died)
  fails every request with 503, stops accepting, and calls ``on_lost`` (``serve`` exits 1).
* :meth:`stop` with ``drain=True`` refuses new requests and returns when every accepted one has
  finished (or the timeout passed: the rest then get an error).

Consumers receive :class:`Event` objects through the callable they submitted with; it is called on
the scheduler thread and must not block (the HTTP front hands the event to its event loop).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.runtime.generate import SamplingSettings, choose_tokens
from dsa_export.serve.metrics import ServeMetrics
from dsa_export.serve.text import IncrementalText, ServedTokenizer
from dsa_export.stages.session import StageLostError

log = logging.getLogger("dsa_export.serve")

#: The slot name the engine runs under (a paged stage keeps one set of pools for every slot).
SLOT = "serve"


class ServeError(Exception):
    """A request the server refuses or could not finish: HTTP ``status`` and OpenAI's error ``type``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.retry_after = retry_after


@dataclass(frozen=True)
class RequestParams:
    """What one request asks for (validated by the HTTP front)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # top alternatives per token; None: no logprobs
    ignore_eos: bool = False


@dataclass
class TokenLogprob:
    token: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]


@dataclass
class Event:
    """What a request's consumer gets after a step: new text (and ids, logprobs), and at the end
    the finish reason and the token counts, or an error."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: ServeError | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class Request:
    """One sequence being served (see :class:`ServingEngine`)."""

    _ids = itertools.count(1)

    def __init__(self, prompt, params: RequestParams, sink: Callable[[Event], None], tokenizer: ServedTokenizer):
        self.id = next(self._ids)
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.params = params
        self.sink = sink
        self.sampling = SamplingSettings(max_new_tokens=params.max_tokens, temperature=params.temperature,
                                         top_p=params.top_p)
        self.rng = np.random.default_rng(params.seed)
        self.detok = IncrementalText(tokenizer)
        self.text = ""  # the text so far (cut at a stop string)
        self.sent = 0  # characters of text already sent
        self.cached = 0  # tokens in the caches
        self.generated: list[int] = []
        self.pages = 0  # pages reserved
        self.cancelled = False
        self.done = False
        self.arrived = time.monotonic()
        self.first_token_at: float | None = None

    @property
    def reading(self) -> bool:
        """Still feeding its prompt."""
        return self.cached < self.prompt.size


@dataclass(frozen=True)
class Limits:
    """What the model allows: rows per call, tokens per row and call, tokens per sequence, pages."""

    batch: int | None
    call: int | None
    sequence: int | None
    pages: int | None
    page: int


def model_limits(model) -> Limits:
    """The smallest limits over the stages of ``model`` (None where nothing bounds them)."""
    batches = [d["batch_limit"] for d in model.describe() if d.get("batch_limit") is not None]
    return Limits(batch=min(batches) if batches else None, call=model.call_limit(), sequence=model.sequence_limit(),
                  pages=model.pages.limit, page=model.pages.page)


class ServingEngine:
    """Continuous batching over a paged pipeline (see the module docstring)."""

    def __init__(self, model, tokenizer: ServedTokenizer, *, eos_token_ids=(), max_batch: int = 16,
                 max_tokens_per_step: int = 512, max_queue: int = 256, max_model_len: int | None = None,
                 kv_pages: int | None = None, metrics: ServeMetrics | None = None,
                 on_lost: Callable[[str], None] | None = None, micro_batches: int = 1):
        if not getattr(model, "paged", False):
            raise DSAUserError("serve needs a paged graph (continuous batching puts requests of different lengths "
                               "in one call); export or build the model with --graph paged.")
        self.model = model
        self.tokenizer = tokenizer
        logits = next((spec for spec in model.outputs if spec.name == "logits"), None)
        width = logits.shape[-1] if logits is not None and logits.shape else None
        #: Token ids the model takes (the logits' width; else the tokenizer's vocabulary).
        self.model_vocab = width if isinstance(width, int) else tokenizer.vocab_size
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.metrics = metrics or ServeMetrics()
        limits = model_limits(model)
        self.page = limits.page
        if limits.batch is not None and max_batch > limits.batch:
            raise DSAUsageError(f"--max-batch {max_batch} is more than this build's batch profile allows "
                                f"({limits.batch}); pass --max-batch {limits.batch} or build with a larger "
                                "--max-batch.")
        self.max_batch = max_batch
        if micro_batches < 1:
            raise DSAUsageError(f"--micro-batches must be at least 1; got {micro_batches}.")
        self.micro_batches = micro_batches
        self.call_limit = limits.call
        if max_tokens_per_step < 1:
            raise DSAUsageError(f"--max-tokens-per-step must be at least 1; got {max_tokens_per_step}.")
        self.max_tokens_per_step = max_tokens_per_step
        if max_queue < 1:  # every request waits (however briefly) before it is admitted
            raise DSAUsageError(f"--max-queue must be at least 1; got {max_queue}.")
        self.max_queue = max_queue
        if limits.sequence is not None and max_model_len is not None and max_model_len > limits.sequence:
            raise DSAUsageError(f"--max-model-len {max_model_len} is more than this build holds per sequence "
                                f"({limits.sequence}); pass at most {limits.sequence} or build with a larger --max-seq.")
        self.max_model_len = max_model_len or limits.sequence or 8192
        # Page 0 is the graph's scratch page; the rest are the requests'.
        if limits.pages is not None:
            if kv_pages is not None and kv_pages > limits.pages:
                raise DSAUsageError(f"--kv-pages {kv_pages} is more than this build's pools hold ({limits.pages}); "
                                    f"pass at most {limits.pages}.")
            total = kv_pages or limits.pages
        else:
            total = kv_pages or 1 + max_batch * math.ceil(self.max_model_len / self.page)
        if total < 2:
            raise DSAUsageError(f"--kv-pages must be at least 2 (page 0 is scratch); got {total}.")
        self.pages_total = total - 1
        model.pages.limit = total
        self.pages_reserved = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.healthy = True
        self.accepting = True
        #: Why the model cannot run any more (a stage is gone), or None; ``on_lost`` is told once.
        self.lost: str | None = None
        self.on_lost = on_lost
        self._stopping = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.metrics.set_capacity(self.pages_total)

    # -- the front's side ------------------------------------------------------------------------

    def pages_for(self, prompt_tokens: int, max_tokens: int) -> int:
        """Pages a request holds at most: its prompt and every generated token but the last."""
        return math.ceil(min(prompt_tokens + max_tokens - 1, self.max_model_len) / self.page)

    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        """ServeError (400) unless a request of this size can ever run here."""
        if prompt_tokens < 1:
            raise ServeError(400, "the prompt is empty; give at least one token.", param="prompt")
        if prompt_tokens > self.max_model_len:
            raise ServeError(400, f"this model's maximum context length is {self.max_model_len} tokens and the prompt "
                                  f"has {prompt_tokens}; shorten the prompt.", param="prompt",
                             kind="invalid_request_error")
        if prompt_tokens + max_tokens - 1 > self.max_model_len:
            raise ServeError(400, f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                                  f"has {prompt_tokens} and max_tokens asks for {max_tokens}; lower max_tokens to at "
                                  f"most {self.max_model_len - prompt_tokens + 1}.", param="max_tokens")
        if self.pages_for(prompt_tokens, max_tokens) > self.pages_total:
            raise ServeError(400, f"this request needs {self.pages_for(prompt_tokens, max_tokens)} cache pages and the "
                                  f"server has {self.pages_total}; lower max_tokens or shorten the prompt.",
                             param="max_tokens")

    def default_max_tokens(self, prompt_tokens: int) -> int:
        """What a request that gives no max_tokens may generate: the rest of the context."""
        return max(1, self.max_model_len - prompt_tokens + 1)

    def submit(self, request: Request) -> None:
        """Queue ``request``; ServeError 429 when the queue is full, 503 when draining or stopped."""
        self.check(int(request.prompt.size), request.params.max_tokens)
        with self._cond:
            if not self.accepting:
                raise ServeError(503, "the server is shutting down; send the request to another instance.",
                                 kind="service_unavailable")
            if len(self.waiting) >= self.max_queue:
                self.metrics.request_done("rejected")
                raise ServeError(429, f"the server's queue is full ({self.max_queue} requests waiting); retry later.",
                                 kind="rate_limit_exceeded", retry_after=1.0)
            self.waiting.append(request)
            self.metrics.set_queue(len(self.waiting), len(self.running))
            self._cond.notify_all()

    def cancel(self, request: Request) -> None:
        """The consumer is gone: drop the request at the next step (its pages freed)."""
        if request.done:
            return
        request.cancelled = True
        with self._cond:
            self._cond.notify_all()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="dsa-serve-scheduler", daemon=True)
        self._thread.start()

    def stop_accepting(self) -> None:
        """Refuse new requests (503) from now on; the accepted ones go on."""
        with self._cond:
            self.accepting = False
            self._cond.notify_all()

    def stop(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop accepting; with ``drain`` wait (up to ``timeout``) for the accepted requests to
        finish. Returns whether they all did; the rest get an error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self.accepting = False
            self._cond.notify_all()
            while drain and (self.waiting or self.running) and self._thread is not None and self._thread.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(0.1 if left is None else min(left, 0.1))
            drained = not (self.waiting or self.running)
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(30)
        for request in list(self.waiting) + list(self.running):
            self._fail(request, ServeError(503, "the server stopped before this request finished; send it again.",
                                           kind="service_unavailable"))
        self.waiting.clear()
        self.running.clear()
        return drained

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self.waiting and not self.running:
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                self._step()
            except Exception:  # a bug of ours: fail what runs, keep the thread alive
                log.exception("the scheduler step failed")
                for request in list(self.running):
                    self._fail(request, ServeError(500, "internal error in the scheduler; see the server log.",
                                                   kind="internal_error"))
            with self._cond:
                self.metrics.set_queue(len(self.waiting), len(self.running))
                self.metrics.set_pages(self.model.pages.pages_in_use, self.model.pages.pages_touched)
                self._cond.notify_all()

    # -- one step --------------------------------------------------------------------------------

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        calls: list[tuple[list[Request], np.ndarray, np.ndarray]] = []
        decode = [r for r in self.running if not r.reading][: self.max_batch]
        for part in np.array_split(np.arange(len(decode)), min(self.micro_batches, len(decode)) or 1):
            if part.size:
                rows = [decode[i] for i in part]
                calls.append((rows, np.array([[r.generated[-1]] for r in rows], dtype=np.int64),
                              np.ones(len(rows), dtype=np.int64)))
        # Prompt chunks: the first reading request sets the call's width; others join while
        # rows x width (padding included: it is computed too) stays within the step's budget.
        budget = max(1, self.max_tokens_per_step - len(decode))
        reading = [r for r in self.running if r.reading and not r.done]
        rows, counts = [], []
        if reading:
            width = min(int(reading[0].prompt.size - reading[0].cached), budget,
                        self.call_limit if self.call_limit is not None else budget)
            for request in reading[: self.max_batch]:
                if rows and (len(rows) + 1) * width > budget:
                    break
                rows.append(request)
                counts.append(min(int(request.prompt.size - request.cached), width))
        if rows:
            width = max(counts)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            for row, (request, count) in enumerate(zip(rows, counts)):
                ids[row, :count] = request.prompt[request.cached: request.cached + count]
            calls.append((rows, ids, np.asarray(counts, dtype=np.int64)))
        if calls:
            self._run(calls)

    def _drop_cancelled(self) -> None:
        with self._cond:
            gone = [r for r in list(self.waiting) + self.running if r.cancelled]
            for request in gone:
                if request in self.waiting:
                    self.waiting.remove(request)
        for request in gone:
            self._finish(request, outcome="cancelled")

    def _admit(self) -> None:
        with self._cond:
            while self.waiting and len(self.running) < self.max_batch:
                request = self.waiting[0]
                need = self.pages_for(int(request.prompt.size), request.params.max_tokens)
                if self.pages_reserved + need > self.pages_total:
                    break  # first come, first served: wait for pages
                self.waiting.popleft()
                request.pages = need
                self.pages_reserved += need
                self.running.append(request)

    def _run(self, calls: list[tuple[list[Request], np.ndarray, np.ndarray]]) -> None:
        """Run the step's calls (submitted together: on a pipeline of several stages they overlap,
        each stage taking them in order), then give every request whose prompt is complete its
        next token."""
        pages = self.model.pages
        feeds = []
        for rows, ids, counts in calls:
            starts = np.array([r.cached for r in rows], dtype=np.int64)
            for request, total in zip(rows, starts + counts):
                pages.ensure(request.id, int(total))
            feeds.append({"input_ids": ids, "query_start": starts.astype(np.int32),
                          "query_lengths": counts.astype(np.int32), "block_table": pages.table([r.id for r in rows])})
        began = time.perf_counter()
        try:
            if len(feeds) == 1 or not hasattr(self.model, "forward_calls"):
                outputs = [self.model.forward(f, SLOT) for f in feeds]
            else:
                outputs = self.model.forward_calls(feeds, SLOT)
        except Exception as exc:  # noqa: BLE001 - a stage failed: fail this step's requests, keep serving
            self.healthy = False
            error = _call_error(exc)
            failed = [request for rows, _ids, _counts in calls for request in rows]
            log.error("a model call of %d rows failed: %s", len(failed), exc)
            for request in failed:
                self._fail(request, error)
            if isinstance(exc, StageLostError):
                self._lost(exc)
            return
        self.healthy = True
        elapsed = time.perf_counter() - began
        for (rows, _ids, counts), out in zip(calls, outputs):
            self.metrics.observe_call(len(rows), int(counts.sum()), elapsed)
            logits = out["logits"]
            for row, (request, count) in enumerate(zip(rows, counts)):
                request.cached += int(count)
                if not request.reading and not request.done:
                    self._next_token(request, logits[row])

    def _next_token(self, request: Request, logits: np.ndarray) -> None:
        params = request.params
        token = int(choose_tokens(logits[None, :], request.sampling, request.rng)[0])
        now = time.monotonic()
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.observe_first_token(now - request.arrived)
        request.generated.append(token)
        self.metrics.count_tokens(generated=1)
        event = Event(tokens=[token])
        if params.logprobs is not None:
            event.logprobs.append(self._logprob(logits, token, params.logprobs))
        finish = None
        if token in self.eos and not params.ignore_eos:
            finish = "stop"  # the end-of-sequence token has no text (skipped as transformers does)
        else:
            request.text += request.detok.push(token)
        if finish is None and len(request.generated) >= params.max_tokens:
            finish = "length"
        if finish is None and request.cached + 1 > self.max_model_len:
            finish = "length"  # the caches cannot take the token just chosen
        if finish is not None:
            request.text += request.detok.finish()
        if params.stop:
            cut = _stop_at(request.text, params.stop, max(0, request.sent - max(map(len, params.stop))))
            if cut is not None:
                request.text = request.text[:cut]
                finish = "stop"
        end = len(request.text)
        if finish is None and params.stop:  # hold back what may be the start of a stop string
            end = max(request.sent, end - (max(map(len, params.stop)) - 1))
        event.text = request.text[request.sent: end]
        request.sent = end
        if finish is not None:
            event.finish_reason = finish
            event.prompt_tokens = int(request.prompt.size)
            event.completion_tokens = len(request.generated)
            self._finish(request, outcome="completed", event=event)
        else:
            _deliver(request, event)

    def _logprob(self, logits: np.ndarray, token: int, top: int) -> TokenLogprob:
        values = logits.astype(np.float64)
        shifted = values - values.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        best: list[tuple[int, str, float]] = []
        if top > 0:
            order = np.argpartition(-logprobs, min(top, logprobs.size - 1))[:top]
            order = order[np.argsort(-logprobs[order], kind="stable")]
            best = [(int(t), self.tokenizer.token_text(int(t)), float(logprobs[t])) for t in order]
        return TokenLogprob(token, self.tokenizer.token_text(token), float(logprobs[token]), best)

    def _lost(self, exc: Exception) -> None:
        """A stage is gone for good: every request gets 503, nothing new is accepted, and the
        owner is told (``serve`` then exits 1 so that a supervisor restarts it)."""
        self.lost = str(exc)
        self.stop_accepting()
        error = ServeError(503, f"the model cannot run any more ({exc}); the server is stopping.",
                           kind="service_unavailable")
        for request in list(self.waiting) + list(self.running):
            self._fail(request, error)
        if self.on_lost is not None:
            self.on_lost(self.lost)

    # -- leaving ---------------------------------------------------------------------------------

    def _release(self, request: Request) -> None:
        self.model.pages.release(request.id)
        with self._cond:
            if request in self.running:
                self.running.remove(request)
                self.pages_reserved -= request.pages
            elif request in self.waiting:
                self.waiting.remove(request)
            request.pages = 0
        # Before the consumer hears the request ended: a client reading /metrics then sees its pages free.
        self.metrics.set_pages(self.model.pages.pages_in_use, self.model.pages.pages_touched)

    def _finish(self, request: Request, outcome: str, event: Event | None = None) -> None:
        if request.done:
            return
        request.done = True
        self._release(request)
        self.metrics.request_done(outcome)
        self.metrics.count_tokens(prompt=int(request.prompt.size))
        if outcome == "completed" and request.first_token_at is not None and len(request.generated) > 1:
            self.metrics.observe_per_token((time.monotonic() - request.first_token_at) / (len(request.generated) - 1))
        if event is not None:
            _deliver(request, event)

    def _fail(self, request: Request, error: ServeError) -> None:
        if request.done:
            return
        request.done = True
        self._release(request)
        self.metrics.request_done("failed")
        _deliver(request, Event(error=error, prompt_tokens=int(request.prompt.size),
                                completion_tokens=len(request.generated)))


def _deliver(request: Request, event: Event) -> None:
    try:
        request.sink(event)
    except Exception:  # noqa: BLE001 - the consumer's loop is gone: the request is over for it
        request.cancelled = True


def _stop_at(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Where the first stop string begins in ``text`` (searching from ``start``), or None."""
    found = [index for index in (text.find(stop, start) for stop in stops if stop) if index >= 0]
    return min(found) if found else None


def _call_error(exc: Exception) -> ServeError:
    if isinstance(exc, StageLostError):
        return ServeError(503, f"a pipeline stage of this model is gone ({exc}); the request was not finished.",
                          kind="service_unavailable")
    message = str(exc) if isinstance(exc, DSAUserError) else f"{type(exc).__name__}: {exc}"
    return ServeError(500, f"the model failed while running this request ({message}).", kind="internal_error")


__all__ = ["Event", "Limits", "Request", "RequestParams", "ServeError", "ServingEngine", "TokenLogprob",
           "model_limits"]
