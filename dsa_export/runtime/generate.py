"""Token generation over a decode graph: prefill, then one token per step, caches kept by the stages.

:func:`generate` drives a :class:`~dsa_export.stages.session.PipelineSession` (a stage export or
stage build, local or on Ray, or one decode graph / build as a pipeline of one stage): the first
call feeds the whole prompt with empty caches, every further call feeds the previous token; the
stages keep their caches per slot (:meth:`PipelineSession.forward`). Over a paged graph the prompts
may have different lengths (each row says where its tokens go: ``query_start``,
``query_lengths``, pages from the pipeline's allocator), the prefill may be cut into chunks of at
most ``prefill_chunk`` tokens per row, and each call returns one row of logits per sequence. Greedy decoding (temperature
0) takes the arg max of the last position's logits, as transformers' ``generate(do_sample=False)``
does; with a temperature it samples from ``softmax(logits / T)`` restricted to the top-p nucleus,
from a seeded generator. A sequence that produced an end-of-sequence id gets the pad id from then
on, and generation stops when every sequence has ended (transformers' rule).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.hf.sizes import check_prefill_chunk


@dataclass(frozen=True)
class SamplingSettings:
    """How tokens are chosen.

    Attributes:
        max_new_tokens: tokens to generate per sequence (fewer when every sequence ends first).
        temperature: 0 = greedy; otherwise the softmax temperature.
        top_p: nucleus sampling: sample among the most likely tokens whose probabilities add up
            to ``top_p`` (1.0 = all).
        seed: seed of the sampling generator (None: fresh entropy).
        eos_token_ids: ids that end a sequence (empty: none does).
        pad_token_id: what an ended sequence gets; default the first end-of-sequence id.
        micro_batches: parts the batch is split into, so that pipeline stages overlap.
        prefill_chunk: prompt tokens per row and call (paged graphs; None: the whole prompt in one
            call, or in calls of the most tokens the build's prefill profile takes when the prompt
            is longer). Smaller chunks bound the prefill's working memory.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    micro_batches: int = 1
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        check_prefill_chunk(self.prefill_chunk, "paged")  # the graph is checked when it is known
        if self.max_new_tokens < 1:
            raise DSAUsageError(f"--max-new-tokens must be at least 1; got {self.max_new_tokens}.")
        if self.temperature < 0:
            raise DSAUsageError(f"--temperature must be 0 (greedy) or positive; got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise DSAUsageError(f"--top-p must be in (0, 1]; got {self.top_p}.")


@dataclass
class GenerationResult:
    """The generated ids ``[B, n]`` and how long prefill and decode took."""

    tokens: np.ndarray
    prompt_tokens: int  # the prompts' tokens, all rows
    prefill_seconds: float
    decode_seconds: float
    steps: int  # calls after the prefill
    notes: list[str] = field(default_factory=list)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else float("inf")

    @property
    def decode_tokens_per_s(self) -> float:
        generated = self.tokens.shape[0] * self.steps
        return generated / self.decode_seconds if self.decode_seconds > 0 else float("inf")

    def to_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "prompt_tokens": self.prompt_tokens,
                "prefill_seconds": round(self.prefill_seconds, 6), "decode_seconds": round(self.decode_seconds, 6),
                "decode_steps": self.steps, "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 3),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 3), "notes": list(self.notes)}


def sample_rows(logits: np.ndarray, temperature, top_p, draws) -> np.ndarray:
    """``[B]`` next ids from ``[B, V]`` logits under per-row settings: the rule of :func:`choose_tokens`
    and of the device sampler (``dsa_sample_tokens``), in float64.

    ``temperature``, ``top_p`` and ``draws`` are scalars or ``[B]``. A row with temperature <= 0 is
    greedy (the arg max, the lowest index on ties; its draw is not used). Otherwise the row samples
    from ``softmax(logits / temperature)``; with top_p < 1 only the nucleus stays (a token is kept
    when the mass of the tokens before it in descending order, ties by index, is below top_p; the
    most likely one always stays), renormalised; the id is the number of cumulative probabilities
    (in vocabulary order) below the row's uniform draw, at most V - 1.
    """
    logits = np.asarray(logits).astype(np.float64)
    rows, vocab = logits.shape
    temperature = np.broadcast_to(np.asarray(temperature, dtype=np.float64), (rows,))
    top_p = np.broadcast_to(np.asarray(top_p, dtype=np.float64), (rows,))
    draws = np.broadcast_to(np.asarray(draws, dtype=np.float64).reshape(-1), (rows,))
    chosen = logits.argmax(axis=-1)
    sampled = np.flatnonzero(temperature > 0)
    if sampled.size == 0:
        return chosen
    scaled = logits[sampled] / temperature[sampled, None]
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    nucleus = np.flatnonzero(top_p[sampled] < 1)
    if nucleus.size:
        part = probs[nucleus]
        order = np.argsort(-part, axis=-1, kind="stable")
        sorted_probs = np.take_along_axis(part, order, axis=-1)
        # Keep a token when the mass before it is below top_p (the most likely one always stays).
        keep_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs < top_p[sampled][nucleus, None]
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        part = np.where(keep, part, 0.0)
        part /= part.sum(axis=-1, keepdims=True)
        probs[nucleus] = part
    cumulative = np.cumsum(probs, axis=-1)
    chosen[sampled] = np.minimum((cumulative < draws[sampled, None]).sum(axis=-1), vocab - 1)
    return chosen


def choose_tokens(logits: np.ndarray, settings: SamplingSettings, rng: np.random.Generator | None = None, *,
                  draws: np.ndarray | None = None) -> np.ndarray:
    """``[B]`` next ids from ``[B, V]`` logits (greedy, or temperature + top-p sampling).

    The uniform draws come from ``rng`` (one ``rng.random`` per row, none when greedy) or, given
    ``draws`` ``[B]`` (e.g. :func:`dsa_export.runtime.philox.philox_uniform` of the rows' seeds and
    steps, the device sampler's draws), from them; the rule is :func:`sample_rows`'.
    """
    logits = np.asarray(logits)
    if settings.temperature == 0:
        return logits.astype(np.float64).argmax(axis=-1)
    if draws is None:
        if rng is None:
            raise ValueError("choose_tokens needs rng or draws to sample (temperature > 0)")
        draws = rng.random((logits.shape[0], 1))
    return sample_rows(logits, settings.temperature, settings.top_p, draws)


def require_decode_graph(model) -> None:
    """DSAUserError unless ``model`` takes token ids and decode caches."""
    names = {spec.name for spec in model.step_inputs}
    if "input_ids" not in names or not any(spec.name.startswith("past_") for spec in model.inputs):
        raise DSAUserError("this model is not a decode graph (it has no input_ids or no past_* caches); export it "
                           "with --graph paged (or --graph decode).")


def prompt_rows(prompts) -> list[np.ndarray]:
    """The prompts as one int64 array per row: a ``[B, L]`` array or a list of id lists."""
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        rows = list(prompts)
    elif isinstance(prompts, (list, tuple)) and prompts:
        rows = [np.asarray(row) for row in prompts]
    else:
        rows = [np.asarray(prompts)]
    for index, row in enumerate(rows):
        if row.ndim != 1 or row.size < 1 or not np.issubdtype(row.dtype, np.integer):
            raise DSAUserError(f"prompt {index} must be a non-empty list of integer token ids; got {row.dtype} of "
                               f"shape {list(row.shape)}.")
    return [row.astype(np.int64) for row in rows]


class _Picker:
    """Chooses each step's tokens: sampling, the pad id once a sequence ended, streaming, and
    transformers' stop rule (every sequence produced an end-of-sequence id)."""

    def __init__(self, settings: SamplingSettings, batch: int, on_tokens: Callable[[np.ndarray], None] | None):
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)
        self.eos = np.asarray(settings.eos_token_ids, dtype=np.int64)
        self.pad = settings.pad_token_id if settings.pad_token_id is not None else (
            int(self.eos[0]) if self.eos.size else 0)
        self.on_tokens = on_tokens
        self.finished = np.zeros(batch, dtype=bool)
        self.generated: list[np.ndarray] = []

    def pick(self, logits: np.ndarray) -> tuple[np.ndarray, bool]:
        """``[B]`` ids from ``[B, V]`` logits, and whether every sequence has ended."""
        chosen = np.where(self.finished, self.pad, choose_tokens(logits, self.settings, self.rng).astype(np.int64))
        self.generated.append(chosen)
        if self.on_tokens is not None:
            self.on_tokens(chosen)
        if self.eos.size:
            self.finished |= np.isin(chosen, self.eos)
        return chosen, bool(self.eos.size and self.finished.all())


def _call_limit(model) -> int | None:
    """:meth:`~dsa_export.stages.session.PipelineSession.call_limit` of a pipeline; None for a
    model without one (a single file: nothing bounds its calls but its sequence limit)."""
    limit = getattr(model, "call_limit", None)
    return limit() if callable(limit) else None


def _room(model, longest: int, steps: int, notes: list[str]) -> int:
    """The steps the build's sequence limit leaves for prompts of up to ``longest`` tokens."""
    limit = model.sequence_limit()
    if limit is None:
        return steps
    if longest > limit:
        raise DSAUserError(f"the prompt has {longest} tokens but this build holds at most {limit} per sequence; "
                           "shorten the prompt or build with a larger --max-seq.")
    # The last chosen token is not fed back, so a sequence of `limit` tokens yields limit - L + 1.
    room = limit - longest + 1
    if room < steps:
        notes.append(f"stopped after {room} new tokens of the {steps} asked: this build holds at most {limit} "
                     "tokens per sequence (build with a larger --max-seq for more)")
        return room
    return steps


def generate(model, prompt_ids, settings: SamplingSettings = SamplingSettings(),
             on_tokens: Callable[[np.ndarray], None] | None = None) -> GenerationResult:
    """Continue the prompts by up to ``settings.max_new_tokens`` tokens each.

    ``prompt_ids``: ``[B, L]`` ids, or (paged graphs) a list of id lists of different lengths.
    ``model`` is a :class:`~dsa_export.stages.session.PipelineSession` over decode or paged
    graphs; ``on_tokens`` gets each step's ``[B]`` ids as soon as they are chosen (for streaming).
    """
    rows = prompt_rows(prompt_ids)
    require_decode_graph(model)
    if getattr(model, "paged", False):
        return _generate_paged(model, rows, settings, on_tokens)
    if len({row.size for row in rows}) != 1:
        raise DSAUserError(f"the prompts have different lengths ({', '.join(str(row.size) for row in rows)} tokens) "
                           "and this decode graph takes one length per batch; export it with --graph paged, or give "
                           "prompts of one length.")
    check_prefill_chunk(settings.prefill_chunk, "decode", fix="export with --graph paged")
    prompt = np.stack(rows)
    notes: list[str] = []
    steps = _room(model, prompt.shape[1], settings.max_new_tokens, notes)
    batch = prompt.shape[0]
    picker = _Picker(settings, batch, on_tokens)
    slot = model.new_slot()
    ids = prompt.astype(np.int64)
    total = ids.shape[1]
    prefill_s = decode_s = 0.0
    try:
        for step in range(steps):
            feeds = {"input_ids": ids, "attention_mask": np.ones((batch, total), dtype=np.int64)}
            began = time.perf_counter()
            logits = model.forward(feeds, slot, settings.micro_batches)["logits"]
            elapsed = time.perf_counter() - began
            if step == 0:
                prefill_s = elapsed
            else:
                decode_s += elapsed
            chosen, ended = picker.pick(logits[:, -1])
            if ended:
                break
            ids = chosen[:, None]
            total += 1
    finally:
        model.release(slot, settings.micro_batches)
    return GenerationResult(tokens=np.stack(picker.generated, axis=1), prompt_tokens=int(prompt.size),
                            prefill_seconds=prefill_s, decode_seconds=decode_s, steps=len(picker.generated) - 1,
                            notes=notes)


def _generate_paged(model, rows: list[np.ndarray], settings: SamplingSettings,
                    on_tokens: Callable[[np.ndarray], None] | None) -> GenerationResult:
    """:func:`generate` over a paged graph: ragged prompts, optional chunked prefill, last-token
    logits; the sequences' pages are handed back at the end."""
    notes: list[str] = []
    lengths = np.array([row.size for row in rows], dtype=np.int64)
    steps = _room(model, int(lengths.max()), settings.max_new_tokens, notes)
    batch = len(rows)
    picker = _Picker(settings, batch, on_tokens)
    pages = model.pages
    slot = model.new_slot()
    sequences = [(slot, row) for row in range(batch)]
    cached = np.zeros(batch, dtype=np.int64)  # tokens each row has in the caches
    prefill_s = decode_s = 0.0

    def call(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        for sequence, total in zip(sequences, cached + counts):
            pages.ensure(sequence, int(total))
        feeds = {"input_ids": ids, "query_start": cached.astype(np.int32), "query_lengths": counts.astype(np.int32),
                 "block_table": pages.table(sequences)}
        return model.forward(feeds, slot, settings.micro_batches)["logits"]

    try:
        # Prefill, whole or in chunks: each row's logits come from the call holding its last token.
        chunk = settings.prefill_chunk or int(lengths.max())
        call_limit = _call_limit(model)  # a build's prefill profile may take fewer tokens than a sequence holds
        if call_limit is not None:
            chunk = min(chunk, call_limit)
        last = np.zeros((batch, 0), dtype=np.float32)
        began = time.perf_counter()
        while (cached < lengths).any():
            counts = np.minimum(lengths - cached, chunk)
            width = int(counts.max())
            ids = np.zeros((batch, width), dtype=np.int64)
            for row in range(batch):
                ids[row, : counts[row]] = rows[row][cached[row]: cached[row] + counts[row]]
            logits = call(ids, counts)
            if last.size == 0:
                last = np.zeros_like(logits)
            done = (counts > 0) & (cached + counts == lengths)
            last[done] = logits[done]
            cached += counts
        prefill_s = time.perf_counter() - began
        logits = last
        for step in range(steps):
            chosen, ended = picker.pick(logits)
            if ended or step == steps - 1:
                break
            began = time.perf_counter()
            logits = call(chosen[:, None], np.ones(batch, dtype=np.int64))
            decode_s += time.perf_counter() - began
            cached += 1
    finally:
        for sequence in sequences:
            pages.release(sequence)
    return GenerationResult(tokens=np.stack(picker.generated, axis=1), prompt_tokens=int(lengths.sum()),
                            prefill_seconds=prefill_s, decode_seconds=decode_s, steps=len(picker.generated) - 1,
                            notes=notes)


# -- what a build came from: the tokenizer and the end-of-sequence ids -----------------------------

def checkpoint_dir(path: str | Path, pipeline=None) -> Path | None:
    """The Hugging Face directory a pipeline folder, build folder or .onnx was made from (None for
    other models or when the recorded path is gone). ``pipeline``: the folder's
    :class:`~dsa_export.stages.record.Pipeline`, when the caller has read it already."""
    recorded = recorded_checkpoint(path, pipeline)
    return recorded if recorded is not None and recorded.is_dir() else None


def recorded_checkpoint(path: str | Path, pipeline=None) -> Path | None:
    """The Hugging Face directory a pipeline folder, build folder or .onnx records it was made from,
    whether or not it is still there (None when it records none). ``pipeline``: as for
    :func:`checkpoint_dir`."""
    from dsa_export.manifest import MANIFEST_NAME, read_manifest
    from dsa_export.model_ref import ModelReference, from_metadata
    from dsa_export.onnx_files import META_SPEC
    from dsa_export.stages.record import PIPELINE_NAME

    path = Path(path)
    reference = None
    if pipeline is not None or (path.is_dir() and (path / PIPELINE_NAME).is_file()):
        from dsa_export.stages.record import read_pipeline

        record = (pipeline or read_pipeline(path)).model
        if record:
            reference = ModelReference.from_json(json.dumps(record)).absolute(path)
    else:
        onnx_path = path
        if path.is_dir() and (path / MANIFEST_NAME).is_file():
            manifest = read_manifest(path)
            onnx_path = manifest.artifact((manifest.data.get("model") or {}).get("onnx", ""))
        if onnx_path.is_file() and onnx_path.suffix == ".onnx":
            import onnx

            meta = {p.key: p.value for p in onnx.load(str(onnx_path), load_external_data=False).metadata_props}
            reference = from_metadata(meta.get(META_SPEC), onnx_path.resolve().parent)
    if reference is None or reference.kind != "hf":
        return None
    return Path(reference.path)


def end_of_sequence(folder: Path | None) -> tuple[tuple[int, ...], int | None]:
    """(eos ids, pad id) from the checkpoint's generation_config.json, else config.json (both
    checked: an id that is not a token of the vocabulary is refused in one sentence)."""
    from dsa_export.hf.config_schema import read_end_of_sequence

    return read_end_of_sequence(folder)


def load_tokenizer(path: Path):
    """The ``tokenizers`` tokenizer of ``tokenizer.json`` (a file or the folder holding it)."""
    from dsa_export.errors import require

    tokenizers = require("tokenizers", "Tokenizing --prompt")
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise DSAUserError(f"{file} does not exist; pass --tokenizer FILE, or token ids with --input-ids FILE.npy.")
    try:
        return tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises a bare Exception on a bad file
        raise DSAUserError(f"{file} is not a tokenizer.json the tokenizers library reads ({exc}).") from exc


def read_input_ids(path: Path) -> np.ndarray | list[np.ndarray]:
    """Token ids from a .npy file (``[B, L]`` or ``[L]``) or a .json file (a list of id lists, of
    different lengths for a paged graph, or one list)."""
    if path.suffix.lower() == ".json":
        return _read_json_ids(path)
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DSAUserError(f"cannot read token ids from {path} ({exc}); pass a .npy of integer ids, shape [B, L], or "
                           "a .json list of id lists.") from exc
    if not isinstance(ids, np.ndarray):
        raise DSAUserError(f"{path} is an .npz archive; pass a .npy of integer ids (numpy.save), shape [B, L].")
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[1] < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise DSAUserError(f"{path} holds {ids.dtype} of shape {list(ids.shape)}; pass integer ids of shape [B, L].")
    return ids.astype(np.int64)


#: The largest .json of token ids read (64 Mi ids of about 8 characters).
MAX_JSON_IDS_BYTES = 512 * 2**20


def _read_json_ids(path: Path) -> list[np.ndarray]:
    remedy = "pass a JSON list of token-id lists, e.g. [[1, 2, 3], [4, 5]]"
    try:
        if path.stat().st_size > MAX_JSON_IDS_BYTES:
            raise DSAUserError(f"{path} is larger than {MAX_JSON_IDS_BYTES >> 20} MiB; {remedy} of fewer tokens, or a "
                               ".npy.")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DSAUserError(f"cannot read token ids from {path} ({exc}); {remedy}.") from None
    if isinstance(data, list) and data and all(isinstance(x, int) and not isinstance(x, bool) for x in data):
        data = [data]
    if not isinstance(data, list) or not data:
        raise DSAUserError(f"{path} holds no list of prompts; {remedy}.")
    rows = []
    for index, row in enumerate(data):
        if (not isinstance(row, list) or not row
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**62 for x in row)):
            raise DSAUserError(f"prompt {index} of {path} is not a non-empty list of non-negative integer ids; {remedy}.")
        rows.append(np.asarray(row, dtype=np.int64))
    return rows


class TextStream:
    """Decodes each sequence's ids as they come and returns the new text. The prompt is decoded
    with them (tokenizers decode whole sequences better than pieces: byte-level pieces join up,
    and the space before the first new word is the decoder's to place)."""

    def __init__(self, tokenizer, prompt_ids):
        self.tokenizer = tokenizer
        self.ids: list[list[int]] = [list(map(int, row)) for row in prompt_ids]
        self.prompt = [self._decode(row) for row in self.ids]
        self.seen = list(self.prompt)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, chosen: Sequence[int]) -> list[str]:
        out = []
        for row, token in enumerate(chosen):
            self.ids[row].append(int(token))
            text = self._decode(self.ids[row])
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the rest
                out.append("")
                continue
            out.append(text[len(self.seen[row]):] if text.startswith(self.seen[row]) else text)
            self.seen[row] = text
        return out

    def flush(self) -> list[str]:
        """The text each sequence still holds back (an incomplete character at the end is given as
        the decoder renders it, U+FFFD), so the streamed pieces add up to :meth:`generated`."""
        out = []
        for row, ids in enumerate(self.ids):
            text = self._decode(ids)
            out.append(text[len(self.seen[row]):] if text.startswith(self.seen[row]) else text)
            self.seen[row] = text
        return out

    def generated(self, row: int = 0) -> str:
        """The text after the prompt (call :meth:`flush` first to include a held-back tail)."""
        text = self._decode(self.ids[row])
        return text[len(self.prompt[row]):] if text.startswith(self.prompt[row]) else text


__all__ = ["GenerationResult", "SamplingSettings", "TextStream", "checkpoint_dir", "choose_tokens",
           "end_of_sequence", "generate", "load_tokenizer", "prompt_rows", "read_input_ids", "recorded_checkpoint",
           "require_decode_graph"]
