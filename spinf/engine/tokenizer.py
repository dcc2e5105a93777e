"""The engine's view of a checkpoint's tokenizer: ``tok(s)``, BOS, offsets and single-token checks.

``tok(s)`` (engine spec, notation) tokenizes ``s`` alone, adds no special tokens and treats special-token text
inside ``s`` as ordinary text, so no user string can ever produce a control or media token. Templates, options and
boundary endings repeat across inputs and requests, so encodings of short strings are memoised.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer

from spinf.errors import ModelError

_MEMO_MAX_CHARS = 4096  # long contents are not worth keeping; templates and options are


class TextTokenizer:
    """Wraps a `tokenizers.Tokenizer` loaded from a checkpoint's ``tokenizer.json``."""

    def __init__(self, tokenizer: Tokenizer):
        self._plain = tokenizer
        self._plain.encode_special_tokens = True  # user text never becomes a special token
        self._plain.no_truncation()
        self._plain.no_padding()
        self.bos: tuple[int, ...] = tuple(tokenizer.encode("", add_special_tokens=True).ids)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._memo = functools.lru_cache(maxsize=65_536)(self._encode)

    @classmethod
    def from_folder(cls, folder: str | Path) -> TextTokenizer:
        path = Path(folder) / "tokenizer.json"
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # the tokenizers library raises plain Exception subclasses
            raise ModelError(f"cannot load the tokenizer {path}: {exc}") from exc

    @property
    def plain(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (the extraction vocabulary reads its token texts)."""
        return self._plain

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self._plain.encode(text, add_special_tokens=False).ids)

    def tok(self, text: str) -> tuple[int, ...]:
        """Token ids of ``text`` alone, no special tokens added."""
        if not text:
            return ()
        if len(text) > _MEMO_MAX_CHARS:
            return self._encode(text)
        return self._memo(text)

    def tok_many(self, texts: list[str]) -> list[tuple[int, ...]]:
        """`tok` of many strings at once (the library batches across threads)."""
        encodings = self._plain.encode_batch(texts, add_special_tokens=False)
        return [tuple(e.ids) for e in encodings]

    def boundaries(self, text: str) -> list[int]:
        """Character offsets where the tokens of ``text`` start (the cut candidates of engine spec A.5)."""
        encoding = self._plain.encode(text, add_special_tokens=False)
        return [start for start, _ in encoding.offsets]

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return self._plain.decode(list(ids), skip_special_tokens=False)
