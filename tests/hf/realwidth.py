"""Session fixtures: synthetic checkpoints at DeepSeek-V3.2's real per-layer widths (and narrow ones).

Import the fixtures where they are needed (``from tests.hf.realwidth import realwidth_checkpoint``)
or into a conftest. Each distinct set of arguments is written once per session, whichever module
asks, and deleted when the session ends.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

#: The smallest checkpoint with DeepSeek-V3.2's real per-layer widths (hidden 7168, 128 heads,
#: MLA 1536/512/128/64/128, indexer 64 x 128, dense intermediate 18432, experts of 2048): one dense
#: and one MoE layer with 4 routed experts (top-2, 2 groups of 2, 1 group chosen) and a 2048-token
#: vocabulary. bf16: 2.10 GB in 3 shards, written in 11-14 s here (2 cores); "fp8": 1.08 GB.
REALWIDTH_CI = dict(kind="deepseek_v32", layers=2, dense_layers=1, experts=4, vocab_size=2048, precision="bf16",
                    shard_bytes=1_000_000_000)

_WRITTEN: dict[str, object] = {}


def _key(args: dict) -> str:
    return json.dumps(args, sort_keys=True, default=str)


@pytest.fixture(scope="session")
def synthetic_checkpoint_factory(tmp_path_factory):
    """``make(kind, **write_checkpoint_args) -> CheckpointInfo``, written once per argument set."""
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    root = Path(tempfile.mkdtemp(prefix="synthetic-", dir=tmp_path_factory.getbasetemp()))
    mine: list[str] = []

    def make(kind: str, **args):
        from dsa_export.hf.synthetic import write_checkpoint

        key = _key({"kind": kind, **args})
        if key not in _WRITTEN:
            _WRITTEN[key] = write_checkpoint(root / f"{kind}-{len(mine)}", kind, **args)
            mine.append(key)
        return _WRITTEN[key]

    yield make
    for key in mine:
        info = _WRITTEN.pop(key)
        shutil.rmtree(info.path, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def realwidth_checkpoint_factory(synthetic_checkpoint_factory):
    """``make(**changes)``: :data:`REALWIDTH_CI` with ``changes`` (e.g. ``precision="fp8"``)."""

    def make(**changes):
        args = {**REALWIDTH_CI, **changes}
        return synthetic_checkpoint_factory(args.pop("kind"), **args)

    return make


@pytest.fixture(scope="session")
def realwidth_checkpoint(realwidth_checkpoint_factory):
    """:data:`REALWIDTH_CI` in bf16 (transformers cannot dequantize real-width FP8, see docs/synthetic.md)."""
    return realwidth_checkpoint_factory()
