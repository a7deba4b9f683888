"""``dsa-export serve``: an OpenAI-compatible HTTP server with continuous batching over a paged
build or export (:mod:`dsa_export.serve.engine` schedules, :mod:`dsa_export.serve.api` speaks
HTTP). Needs the ``serve`` extra (FastAPI, uvicorn)."""
