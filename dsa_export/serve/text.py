"""Text in and out of the server: the checkpoint's tokenizer, its chat template, and text that
grows one token at a time.

The tokenizer is the checkpoint's, loaded by transformers (``AutoTokenizer``) when the folder has
a ``tokenizer_config.json`` (special tokens, chat template from that file or
``chat_template.jinja``), else the bare ``tokenizer.json`` (completions only: no chat template).
Prompts are encoded as transformers encodes them (special tokens added, e.g. the BOS token); chat
messages are rendered with the template (``add_generation_prompt=True``) and encoded without
adding special tokens again (the template writes them). Generated text is decoded with special
tokens skipped, as ``tokenizer.decode(ids, skip_special_tokens=True)`` does for transformers'
generated ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError, require


class ServedTokenizer:
    """Encodes prompts, renders chat messages, decodes tokens (see the module docstring)."""

    def __init__(self, path: Path):
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise DSAUserError(f"{file} does not exist; pass the checkpoint's tokenizer with --tokenizer FILE.")
        transformers = require("transformers", "Serving text (the checkpoint's tokenizer)", "pip install 'dsa-export[hf]'")
        try:
            if path.is_dir() and (folder / "tokenizer_config.json").is_file():
                self.hf = transformers.AutoTokenizer.from_pretrained(str(folder))
            else:
                self.hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(file))
        except Exception as exc:  # the library raises many kinds on a bad file
            raise DSAUserError(f"cannot load the tokenizer at {path} ({exc}); pass a tokenizer.json the tokenizers "
                               "library reads with --tokenizer.") from exc
        self.path = path
        self.vocab_size = len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text of ``messages`` under the chat template, ready for the assistant's turn."""
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return list(self.hf(self.chat_prompt(messages), add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def token_text(self, token: int) -> str:
        """One token as text (for logprobs)."""
        return self.hf.decode([token], skip_special_tokens=False)


class IncrementalText:
    """The text of a growing list of generated ids, one delta per token, equal in sum to decoding
    them all at once.

    Each push decodes only a window: from the last token whose text is settled (``prefix``) to the
    end, minus the same window up to the last token already turned into text (``read``), so the
    work per token stays flat while the leading space and multi-byte characters come out as a
    whole decode gives them. A token that ends inside a UTF-8 character yields nothing until the
    character is complete; :meth:`finish` gives whatever is still held back.
    """

    def __init__(self, tokenizer: ServedTokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0
        self.text = ""

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        before = self.tokenizer.decode(self.ids[self.prefix: self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        if after.endswith("\ufffd") or len(after) <= len(before) or not after.startswith(before):
            if not after.startswith(before):  # the window re-rendered its start: settle on a whole decode
                return self._resync()
            return ""
        delta = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += delta
        return delta

    def _resync(self) -> str:
        whole = self.tokenizer.decode(self.ids)
        if whole.endswith("\ufffd") or not whole.startswith(self.text):
            return ""
        delta = whole[len(self.text):]
        self.text = whole
        self.prefix, self.read = max(0, len(self.ids) - 1), len(self.ids)
        return delta

    def finish(self) -> str:
        """The text still held back (an incomplete character at the end, as the decoder renders it)."""
        whole = self.tokenizer.decode(self.ids)
        delta = whole[len(self.text):] if whole.startswith(self.text) else ""
        self.text += delta
        return delta


__all__ = ["IncrementalText", "ServedTokenizer"]
