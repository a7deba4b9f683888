"""Run the ``dsa-export`` CLI in this process and count how often it reads a checkpoint's files.

``python -m tests.read_counts COUNTS.json CHECKPOINT_DIR ARGS...`` runs ``dsa-export ARGS...`` and
writes ``{"opens": {file name: count}, "headers": {shard name: count}, "exit": code}`` to
COUNTS.json: every ``open()`` of a file directly in CHECKPOINT_DIR (config.json, the index, the
shards: a shard is also opened for each tensor read, which is the data, not the header) and every
safetensors header parsed (:func:`dsa_export.hf.checkpoint.read_header`, wherever it is called
from). The tests use it to hold one command to one read of each input.
"""

from __future__ import annotations

import builtins
import collections
import io
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    counts_file, folder, args = Path(argv[0]), Path(argv[1]).resolve(), argv[2:]
    opens: collections.Counter[str] = collections.Counter()
    headers: collections.Counter[str] = collections.Counter()
    real_open = builtins.open

    def counting_open(file, *a, **k):
        if isinstance(file, (str, Path)) and Path(file).resolve().parent == folder:
            opens[Path(file).name] += 1
        return real_open(file, *a, **k)

    import dsa_export.hf.checkpoint as checkpoint
    import dsa_export.hf.sizes as sizes

    real_read_header = checkpoint.read_header

    def counting_read_header(path):
        headers[Path(path).name] += 1
        return real_read_header(path)

    checkpoint.read_header = sizes.read_header = counting_read_header
    builtins.open = io.open = counting_open
    from dsa_export.cli.main import main as cli_main

    code = 0
    try:
        cli_main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        builtins.open = io.open = real_open
        counts_file.write_text(json.dumps({"opens": opens, "headers": headers, "exit": code}))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
