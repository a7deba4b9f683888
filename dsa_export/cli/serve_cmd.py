"""``dsa-export serve``."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
from pathlib import Path

import click

from dsa_export.errors import DSAUserError, require
from dsa_export.runtime.session import RUNTIME_CHOICES


@click.command(name="serve")
@click.argument("model_dir", metavar="ARTIFACT", type=click.Path(exists=True, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: any free port; the ready line says which).")
@click.option("--max-batch", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests in the running batch at most (at most the build's batch profile).")
@click.option("--max-tokens-per-step", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens one scheduler step feeds: decode rows plus prompt chunks of requests starting.")
@click.option("--max-queue", type=click.IntRange(min=1), default=256, show_default=True,
              help="Requests waiting at most; more are answered 429 with Retry-After.")
@click.option("--max-model-len", type=click.IntRange(min=1), default=None,
              help="Tokens per sequence (prompt and answer) at most; default: the build's limit (8192 for an .onnx).")
@click.option("--kv-pages", type=click.IntRange(min=2), default=None,
              help="Cache pages of the pools (64 tokens each, page 0 scratch); default: the build's pages profile, "
                   "for an .onnx enough for --max-batch sequences of --max-model-len.")
@click.option("--runtime", type=click.Choice(RUNTIME_CHOICES), default="auto", show_default=True,
              help="auto: each stage's engine where it can run here, else its ONNX Runtime artifact.")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="Run each pipeline stage in a Ray actor (as generate --ray); the HTTP front stays in this process.")
@click.option("--micro-batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cut each step's decode rows into M calls; with the prefill call they overlap across pipeline "
                   "stages.")
@click.option("--api-key", envvar="DSA_EXPORT_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1/* (also from $DSA_EXPORT_API_KEY).")
@click.option("--served-model-name", default=None,
              help="The model name clients give (default: the checkpoint folder's name).")
@click.option("--tokenizer", type=click.Path(exists=True, path_type=Path), default=None,
              help="Tokenizer folder or tokenizer.json; default: the checkpoint the build came from.")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds SIGTERM/SIGINT waits for requests in flight before the server stops anyway.")
@click.option("--access-log", is_flag=True, help="Log every HTTP request to stderr.")
@click.option("--no-verify", is_flag=True, help="Open the files without checking their recorded sizes and sha256.")
def command(model_dir: Path, host: str, port: int, max_batch: int, max_tokens_per_step: int, max_queue: int,
            max_model_len: int | None, kv_pages: int | None, runtime: str, ray_address: str | None,
            micro_batches: int, api_key: str | None, served_model_name: str | None, tokenizer: Path | None, drain_timeout: float,
            access_log: bool, no_verify: bool) -> None:
    """Serve ARTIFACT behind OpenAI's API with continuous batching: a stage build or stage export
    (pipeline.json), a build folder or a paged-graph .onnx (export or build with --graph paged).

    Endpoints: /v1/completions, /v1/chat/completions (the checkpoint's chat template), both with
    stream: true; /v1/models, /health, /metrics (Prometheus). Prints one line when ready.
    SIGTERM or Ctrl-C stops accepting, lets the requests in flight finish (--drain-timeout), and
    exits 0.
    """
    require("fastapi", "dsa-export serve", "pip install 'dsa-export[serve]'")
    uvicorn = require("uvicorn", "dsa-export serve", "pip install 'dsa-export[serve]'")
    from dsa_export import interrupts
    from dsa_export.cli.generate_cmd import _open, pipeline_record
    from dsa_export.runtime import generate as gen
    from dsa_export.serve.api import create_app
    from dsa_export.serve.engine import ServingEngine
    from dsa_export.serve.text import ServedTokenizer

    if api_key is not None and not api_key:
        raise click.UsageError("--api-key is empty; give a key or leave the option out.")
    record = pipeline_record(model_dir)  # pipeline.json, read once for the tokenizer and the stages
    checkpoint = gen.checkpoint_dir(model_dir, record)
    if tokenizer is None and checkpoint is None:
        recorded = gen.recorded_checkpoint(model_dir, record)
        where = (f"was made from the checkpoint {recorded}, which is not there any more"
                 if recorded is not None else "records no Hugging Face checkpoint")
        raise click.UsageError(f"{model_dir} {where}; pass the tokenizer with --tokenizer PATH.")
    text = ServedTokenizer(tokenizer or checkpoint)  # type: ignore[arg-type]
    eos, _pad = gen.end_of_sequence(checkpoint)
    name = served_model_name or (checkpoint.name if checkpoint is not None else model_dir.resolve().name)
    listener = _listen(host, port)
    model = _open(model_dir, runtime, ray_address, not no_verify, record)
    try:
        for note in model.notes:
            click.echo(note, err=True)
        server = None

        def lost(_why: str) -> None:  # a stage is gone: stop serving, exit 1 (a supervisor restarts us)
            if server is not None:
                server.should_exit = True

        engine = ServingEngine(model, text, eos_token_ids=eos, max_batch=max_batch,
                               max_tokens_per_step=max_tokens_per_step, max_queue=max_queue,
                               max_model_len=max_model_len, kv_pages=kv_pages, on_lost=lost,
                               micro_batches=micro_batches)
        app = create_app(engine, text, name, api_key=api_key)
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        config = uvicorn.Config(app, log_level="warning", access_log=access_log, lifespan="off",
                                timeout_graceful_shutdown=drain_timeout or None)
        bound = listener.getsockname()
        ready = (f"dsa-export serve: ready at http://{_show(bound[0])}:{bound[1]}/v1 (model '{name}', "
                 f"max batch {engine.max_batch}, max model len {engine.max_model_len}, "
                 f"{engine.pages_total} cache pages of {engine.page} tokens)")
        server = _Server(config, engine, ready)
        engine.start()
        try:
            # The drain is ours: a first signal only starts it; the process is ended from outside
            # only if it has not finished well after --drain-timeout (a second signal ends it at once).
            with interrupts.handled_by_command(drain_timeout + 15):
                server.run(sockets=[listener])
        finally:
            drained = engine.stop(drain=True, timeout=drain_timeout)
        if engine.lost is not None:
            raise DSAUserError(f"serve stopped (the requests in flight were answered with 503): {engine.lost}")
        if not drained:
            click.echo("dsa-export serve: stopped with requests unfinished (--drain-timeout passed); they were "
                       "answered with 503.", err=True)
        else:
            click.echo("dsa-export serve: stopped.", err=True)
    finally:
        listener.close()
        model.close()


def _show(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a bad address or a busy port is one clear error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DSAUserError(f"cannot listen on {host}:{port}: the address does not resolve ({exc.strerror}); pass "
                           "--host with an address of this machine.") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise DSAUserError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port (0: any free "
                           "one) or --host.") from None
    sock.set_inheritable(True)
    return sock


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, printing the ready line once listening, telling the engine to stop
        accepting on the first signal, and not raising the signal again after the drain (the
        command then exits 0)."""

        def __init__(self, config, engine, ready: str):
            super().__init__(config)
            self.engine = engine
            self.ready = ready

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                click.echo(self.ready)
                sys.stdout.flush()

        def handle_exit(self, sig, frame) -> None:
            self.engine.stop_accepting()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server


def _Server(config, engine, ready):
    return _server_class()(config, engine, ready)
