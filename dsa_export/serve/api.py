"""The HTTP front of ``dsa-export serve``: OpenAI's API on FastAPI.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (OpenAI's request and response shapes,
``stream: true`` as server-sent events ending in ``data: [DONE]``), ``GET /v1/models``,
``GET /health`` (503 while a stage is failing or the server drains), ``GET /metrics`` (Prometheus
text). Errors have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for a
bad request, 401 for a wrong API key, 404 for another model name, 429 (with Retry-After) when the
queue is full, 500/503 when the model failed or the server is stopping.

Each request becomes a :class:`~dsa_export.serve.engine.Request` of the scheduler; its events
come back through an :class:`asyncio.Queue` of this event loop. A client that goes away (a closed
stream, or a non-streaming client that disconnects) cancels its request: its pages are freed at
the next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from dsa_export.serve.engine import (
    Event,
    Request,
    RequestParams,
    ServeError,
    ServingEngine,
    TokenLogprob,
)
from dsa_export.serve.text import ServedTokenizer

#: Seconds between checks that a non-streaming client is still connected.
DISCONNECT_POLL_S = 0.5
MAX_STOP = 4  # OpenAI allows up to 4 stop sequences
MAX_LOGPROBS = 20


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields we do not use (user, metadata, ...)

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False


class CompletionBody(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatBody(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None


def error_body(error: ServeError) -> dict[str, Any]:
    return {"error": {"message": error.message, "type": error.kind, "param": error.param,
                      "code": error.status}}


def error_response(error: ServeError) -> JSONResponse:
    headers = {"Retry-After": str(max(1, round(error.retry_after)))} if error.retry_after is not None else None
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


def create_app(engine: ServingEngine, tokenizer: ServedTokenizer, model_name: str, *,
               api_key: str | None = None) -> FastAPI:
    """The FastAPI application over a started ``engine``."""
    app = FastAPI(title="dsa-export serve", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    @app.exception_handler(ServeError)
    async def _serve_error(_request, exc: ServeError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return error_response(ServeError(400, f"invalid request: {where or 'body'}: {first.get('msg', 'invalid')}.",
                                         param=where or None))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request, exc: StarletteHTTPException):
        kinds = {404: "not_found_error", 405: "invalid_request_error"}
        return error_response(ServeError(exc.status_code, str(exc.detail), kind=kinds.get(exc.status_code, "error")))

    @app.middleware("http")
    async def _authorize(request: HTTPRequest, call_next):
        if api_key is not None and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                return error_response(ServeError(401, "invalid API key; pass the server's key as 'Authorization: "
                                                      "Bearer KEY'.", kind="authentication_error"))
        return await call_next(request)

    @app.get("/health")
    async def health():
        if not engine.accepting:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not engine.healthy:
            return JSONResponse({"status": "failing", "detail": "the last model call failed"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                             "owned_by": "dsa-export", "max_model_len": engine.max_model_len}]}

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ServeError(404, f"the model '{name}' does not exist here; this server serves '{model_name}'.",
                             kind="not_found_error", param="model")

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, http: HTTPRequest):
        check_model(body.model)
        _refuse_unsupported(body)
        if body.echo:
            raise ServeError(400, "echo is not supported; the prompt is what you sent.", param="echo")
        if body.suffix:
            raise ServeError(400, "suffix (insertion) is not supported by this model.", param="suffix")
        if body.best_of not in (None, 1):
            raise ServeError(400, "best_of must be 1 (one completion per request).", param="best_of")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ServeError(400, f"the prompt holds {len(prompt)} prompts; send one prompt per request.",
                                 param="prompt")
            prompt = prompt[0]
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        _check_ids(ids, engine.model_vocab)
        max_tokens = body.max_tokens if body.max_tokens is not None else engine.default_max_tokens(len(ids))
        params = _params(body, max_tokens, body.logprobs)
        return await _respond(http, body, ids, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, http: HTTPRequest):
        check_model(body.model)
        _refuse_unsupported(body)
        if body.tools:
            raise ServeError(400, "tools (function calling) are not supported by this server.", param="tools")
        if body.response_format and body.response_format.get("type", "text") != "text":
            raise ServeError(400, "only response_format {'type': 'text'} is supported.", param="response_format")
        if not tokenizer.has_chat_template:
            raise ServeError(400, "this model's tokenizer has no chat template; use /v1/completions.",
                             param="messages")
        messages = [_message(index, m) for index, m in enumerate(body.messages)]
        try:
            ids = tokenizer.encode_chat(messages)
        except Exception as exc:  # the template raised (e.g. roles it does not take)
            raise ServeError(400, f"the chat template rejected these messages ({exc}).", param="messages") from exc
        wanted = body.max_completion_tokens or body.max_tokens
        max_tokens = wanted if wanted is not None else engine.default_max_tokens(len(ids))
        top = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs and not body.logprobs:
            raise ServeError(400, "top_logprobs needs logprobs: true.", param="top_logprobs")
        params = _params(body, max_tokens, top)
        return await _respond(http, body, ids, params, chat=True)

    async def _respond(http: HTTPRequest, body: _Common, ids: list[int], params: RequestParams, chat: bool):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        request = Request(ids, params, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event), tokenizer)
        engine.submit(request)  # ServeError: 400, 429, 503
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        shape = _Shape(ident, model_name, chat, params.logprobs is not None)
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(_stream(engine, request, queue, shape, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        events: list[Event] = []
        try:
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await http.is_disconnected():
                        engine.cancel(request)
                        return PlainTextResponse("", status_code=499)
                    continue
                if event.error is not None:
                    return error_response(event.error)
                events.append(event)
                if event.final:
                    return JSONResponse(shape.whole(events))
        finally:
            if not request.done:
                engine.cancel(request)

    return app


async def _stream(engine: ServingEngine, request: Request, queue: asyncio.Queue, shape: _Shape,
                  usage: bool) -> AsyncIterator[str]:
    """Server-sent events of one request; a client that goes away cancels it (Starlette cancels
    this generator, the ``finally`` runs)."""
    try:
        if shape.chat:
            yield _sse(shape.chunk(Event(), role=True))
        while True:
            event = await queue.get()
            if event.error is not None:
                yield _sse(error_body(event.error))
                break
            if event.text or event.finish_reason or event.logprobs:
                yield _sse(shape.chunk(event))
            if event.final:
                if usage:
                    yield _sse(shape.usage_chunk(event))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not request.done:
            engine.cancel(request)


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Shape:
    """OpenAI's response objects for one request."""

    def __init__(self, ident: str, model: str, chat: bool, logprobs: bool):
        self.id = ident
        self.model = model
        self.chat = chat
        self.logprobs = logprobs
        self.created = int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, entries: list[TokenLogprob], offset: int = 0) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [{"token": e.text, "logprob": e.logprob, "bytes": list(e.text.encode()),
                                 "top_logprobs": [{"token": text, "logprob": lp, "bytes": list(text.encode())}
                                                  for _t, text, lp in e.top]} for e in entries]}
        offsets, position = [], offset
        for e in entries:
            offsets.append(position)
            position += len(e.text)
        return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{text: lp for _t, text, lp in e.top} for e in entries], "text_offset": offsets}

    @staticmethod
    def _usage(event: Event) -> dict[str, int]:
        return {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
                "total_tokens": event.prompt_tokens + event.completion_tokens}

    def whole(self, events: list[Event]) -> dict[str, Any]:
        text = "".join(e.text for e in events)
        entries = [entry for e in events for entry in e.logprobs]
        last = events[-1]
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": self._logprobs(entries), "finish_reason": last.finish_reason}
            return {**self._head("chat.completion"), "choices": [choice], "usage": self._usage(last)}
        choice = {"index": 0, "text": text, "logprobs": self._logprobs(entries), "finish_reason": last.finish_reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": self._usage(last)}

    def chunk(self, event: Event, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {"content": event.text} if event.text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None if role else self._logprobs(event.logprobs),
                      "finish_reason": event.finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": event.text, "logprobs": self._logprobs(event.logprobs),
                  "finish_reason": event.finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, event: Event) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": self._usage(event)}


def _refuse_unsupported(body: _Common) -> None:
    if body.n != 1:
        raise ServeError(400, f"n must be 1 (one choice per request); got {body.n}. Send n requests instead.",
                         param="n")
    if body.presence_penalty or body.frequency_penalty:
        raise ServeError(400, "presence_penalty and frequency_penalty are not supported; leave them at 0.",
                         param="presence_penalty" if body.presence_penalty else "frequency_penalty")
    if body.logit_bias:
        raise ServeError(400, "logit_bias is not supported.", param="logit_bias")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise ServeError(400, f"stop takes up to {MAX_STOP} non-empty strings.", param="stop")


def _params(body: _Common, max_tokens: int, logprobs: int | None) -> RequestParams:
    stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return RequestParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, seed=body.seed,
                         stop=stops, logprobs=logprobs, ignore_eos=body.ignore_eos)


def _check_ids(ids: list[int], vocab: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ServeError(400, f"the prompt holds token id {bad[0]}, outside this model's vocabulary (0..{vocab - 1}).",
                         param="prompt")


def _message(index: int, message: dict[str, Any]) -> dict[str, Any]:
    """One chat message with its content as text (text parts joined; other parts refused)."""
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise ServeError(400, f"message {index} has no role.", param=f"messages.{index}.role")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ServeError(400, f"message {index} holds a content part other than text; this model takes text "
                                      "only.", param=f"messages.{index}.content")
            texts.append(part["text"])
        content = "".join(texts)
    if content is not None and not isinstance(content, str):
        raise ServeError(400, f"message {index}'s content must be a string or a list of text parts.",
                         param=f"messages.{index}.content")
    return {**message, "content": content or ""}


__all__ = ["create_app", "error_body"]
