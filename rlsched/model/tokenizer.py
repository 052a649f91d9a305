"""Byte-level tokenizer, saved in the `tokenizers` library's format, and an incremental detokenizer.

Ids 0-5 are the special tokens, ids 6-261 are the 256 byte values in order. Any UTF-8 text encodes
without an unknown token, and the same `tokenizer.json` is loaded unchanged by transformers and vLLM
(a ByteLevel pre-tokenizer over a BPE model with no merges: every byte is one token).

Encoding goes through the `tokenizers` library so that rlsched, transformers and vLLM split special
tokens identically. Decoding is ours: a byte table plus the stdlib incremental UTF-8 decoder, which
holds back the bytes of a character that has not fully arrived, so a stream never shows half a
character.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID, IM_START_ID, IM_END_ID = range(6)
BYTE_OFFSET = len(SPECIAL_TOKENS)
TOKENIZER_VOCAB = BYTE_OFFSET + 256


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the alphabet of ByteLevel."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def build_hf_tokenizer() -> Tokenizer:
    """The `tokenizers` object that is written as `tokenizer.json`."""
    byte_chars = _bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({byte_chars[b]: BYTE_OFFSET + b for b in range(256)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


class ByteTokenizer:
    """Encode text (special tokens recognised) to ids; decode ids to text or bytes."""

    def __init__(self, hf: Tokenizer | None = None) -> None:
        self._hf = hf if hf is not None else build_hf_tokenizer()
        self.vocab_size = TOKENIZER_VOCAB
        self.special_ids = frozenset(range(BYTE_OFFSET))

    @classmethod
    def from_file(cls, path: Path) -> ByteTokenizer:
        tok = Tokenizer.from_file(str(path))
        if tok.get_vocab_size(with_added_tokens=True) != TOKENIZER_VOCAB:
            raise ValueError(f"{path} is not an rlsched byte-level tokenizer (vocab size differs)")
        return cls(tok)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(json.loads(self._hf.to_str()), indent=1, ensure_ascii=False))

    def encode(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for; special tokens stand for their own text."""
        if token_id < BYTE_OFFSET:
            return SPECIAL_TOKENS[token_id].encode()
        if token_id < TOKENIZER_VOCAB:
            return bytes((token_id - BYTE_OFFSET,))
        return b""  # padding rows of the embedding: never produced by a trained model

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        data = b"".join(
            self.token_bytes(i) for i in ids if not (skip_special_tokens and i in self.special_ids)
        )
        return data.decode("utf-8", errors="replace")

    def id_of(self, token: str) -> int:
        return SPECIAL_TOKENS.index(token)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never split a character."""

    def __init__(self, tokenizer: ByteTokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the new complete characters (possibly empty)."""
        if self._skip and token_id in self._tok.special_ids:
            return ""
        delta = self._decoder.decode(self._tok.token_bytes(token_id))
        self.text += delta
        return delta

    def flush(self) -> str:
        """End of stream: bytes still held back become replacement characters."""
        delta = self._decoder.decode(b"", final=True)
        self.text += delta
        return delta
