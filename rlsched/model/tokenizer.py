"""A checkpoint's tokenizer (transformers' `AutoTokenizer`) and an incremental detokenizer.

`Tokenizer` is the narrow face rlsched needs of a Hugging Face tokenizer: encode text to ids
without adding special tokens (a chat template already wrote BOS where the model wants one, as
vLLM's chat path does), decode ids, tell special tokens apart, render the checkpoint's own chat
template. Encoding goes through the fast (Rust) tokenizer, so rlsched, transformers and vLLM split
text, special tokens included, identically.

`IncrementalDetokenizer` turns a growing list of ids into text deltas the way vLLM and TGI do: it
decodes a short window of recent ids and emits only text that a longer window cannot change, and it
holds back a trailing partial character (U+FFFD from a byte-level or byte-fallback token that does
not yet form a whole character). That works for any tokenizer whose decoding depends on context
(SentencePiece's leading spaces, byte-level BPE's split characters), where decoding token by token
would not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"


class Tokenizer:
    """Encode text (special tokens recognised) to ids; decode ids to text."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self._fast = getattr(hf, "backend_tokenizer", None)  # the `tokenizers` object, when fast
        self.vocab_size = len(hf)
        self.special_ids = frozenset(int(i) for i in hf.all_special_ids)
        decoder = getattr(hf, "added_tokens_decoder", {})  # id -> AddedToken, `special` among its flags
        self.special_strings = frozenset(
            {str(t) for t in hf.all_special_tokens}
            | {str(t.content) for t in decoder.values() if getattr(t, "special", False)}
        )

    @classmethod
    def from_dir(cls, path: Path) -> Tokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path), trust_remote_code=False))

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.hf, "chat_template", None)
        return template if isinstance(template, str) and template.strip() else None

    @property
    def eos_token_id(self) -> int | None:
        eos = self.hf.eos_token_id
        return int(eos) if eos is not None else None

    @property
    def pad_token_id(self) -> int | None:
        pad = self.hf.pad_token_id
        return int(pad) if pad is not None else None

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=False).ids)
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_text(self, text: str) -> list[int]:
        """`text` encoded with every special token's string in it read as plain text (`<|im_end|>`
        as `<`, `|`, `im`, ...): message content, never a control token (`rlsched.model.content`)."""
        if self._fast is not None:
            before = self._fast.encode_special_tokens
            self._fast.encode_special_tokens = True
            try:
                return list(self._fast.encode(text, add_special_tokens=False).ids)
            finally:
                self._fast.encode_special_tokens = before
        return list(self.hf.encode(text, add_special_tokens=False, split_special_tokens=True))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._fast is not None:
            return [list(e.ids) for e in self._fast.encode_batch(list(texts), add_special_tokens=False)]
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        if self._fast is not None:
            return str(self._fast.decode(ids, skip_special_tokens=skip_special_tokens))
        return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens))

    def id_of(self, token: str) -> int | None:
        """The id of a token written as text (e.g. '<|im_end|>'), or None if it is not one token."""
        ids = self.encode(token)
        return ids[0] if len(ids) == 1 and self.decode(ids, skip_special_tokens=False) == token else None

    def save(self, out: Path) -> None:
        self.hf.save_pretrained(str(out))


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never split a character."""

    # ids decoded before the read offset, so that context-dependent decoders (a leading space
    # that belongs to the next word) see enough to decode the new ids as the whole text would
    CONTEXT = 6

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids before this have been emitted as text
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the new complete characters (possibly empty)."""
        self._ids.append(token_id)
        window = self._tok.decode(self._ids[self._prefix :], self._skip)
        seen = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        if len(window) <= len(seen) or window.endswith(REPLACEMENT):
            return ""  # nothing new yet, or a character still incomplete
        delta = window[len(seen) :]
        self._read = len(self._ids)
        self._prefix = max(0, self._read - self.CONTEXT)
        self.text += delta
        return delta

    def flush(self) -> str:
        """End of stream: what is held back is emitted (an incomplete character as U+FFFD)."""
        window = self._tok.decode(self._ids[self._prefix :], self._skip)
        seen = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        delta = window[len(seen) :] if len(window) > len(seen) else ""
        self._read = len(self._ids)
        self.text += delta
        return delta
