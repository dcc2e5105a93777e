"""Per-tokenizer tables of extraction slots: the number candidates and their grammar table, the stop and
continuation masks (engine spec A.12.2, A.12.3).

Everything here depends only on the tokenizer (and its end-of-sequence ids), so it is built once per tokenizer
(`vocabulary` caches it) and handed to the decoder as tensors: a decoder advances all its beams with gathers over
`NumberTable.next_state` and masks logits with `Vocabulary.stop_mask` / `Vocabulary.forbidden_mask`, with no host
round trip per step.

**A token's text** is that id decoded alone by the tokenizer (`Tokenizer.decode([id])`, special tokens kept). That
is the text the token adds to an answer, which is the decode of the whole id sequence: the vocabulary's own pieces
are not text (byte-level BPE spells a space `Ġ` and a newline `Ċ`; SentencePiece spells a space `▁` and keeps
byte-fallback pieces as `<0x0A>`), so "starts with `"`", "contains a newline" or "is ` million`" read on the pieces
would be wrong, while the decoder maps each to the characters it stands for. A piece that holds only part of a
multi-byte character decodes alone to U+FFFD: it is in no alphabet and starts with no stop character, so a number
slot can use `€ £ ¥ −` only where the vocabulary has a piece for the whole character (Gemma's does; the tiny model's
byte-level vocabulary does not). This reading assumes a decoder without a step that strips the first token's
leading space (Llama's `Strip`); the tokenizers of the models served (Gemma, Qwen) have none.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable

import attrs
import torch
from tokenizers import Tokenizer

from spinf.engine.extraction.answers import stop_characters
from spinf.engine.extraction.grammar import NUMBER_ALPHABET, SCALE_WORDS, START, State, complete, feed

# Besides the checkpoint's EOS, these end a sequence wherever the tokenizer has them (A.12.2).
END_TOKENS = ("<end_of_turn>", "<turn|>", "<|im_end|>", "<|endoftext|>")
_ALPHABET = frozenset(NUMBER_ALPHABET)


@attrs.frozen
class NumberTable:
    """The number grammar of A.12.4 over the candidate tokens of A.12.3, for `{n}` and `{$}` slots in one table.

    ``candidates`` [C] int64: the token ids whose whole text uses only the number alphabet, or is exactly a scale
    word (special tokens excluded). ``next_state`` [Q, C] int64: the state index a candidate drives each state to,
    -1 where it is not a valid extension (a decoder masks with ``next_state < 0`` before it uses the value as an
    index: -1 would read the last row). ``complete`` [Q] bool: whether a number may end in the state. ``states``
    lists each index's ``(currency_slot, State)``; the two kinds never share a state, so a slot only names its start
    (`start`). Q is a few tens, C a few hundred to a few thousand, so the table is small enough to keep on the device.
    """

    candidates: torch.Tensor
    next_state: torch.Tensor
    complete: torch.Tensor
    states: tuple[tuple[bool, State], ...]

    def start(self, currency_slot: bool) -> int:
        """The start state's index of a `{$}` slot (``currency_slot``) or of a `{n}` slot."""
        return self.states.index((currency_slot, START))

    def to(self, device: torch.device | str) -> NumberTable:
        return attrs.evolve(
            self,
            candidates=self.candidates.to(device),
            next_state=self.next_state.to(device),
            complete=self.complete.to(device),
        )


@attrs.frozen
class Vocabulary:
    """One tokenizer's token texts and the masks built from them. Masks are [V] bool CPU tensors, V the model's
    logit width; ids beyond the tokenizer's vocabulary have no text and are only ever masked from continuations."""

    texts: tuple[str, ...]  # each known id decoded alone
    num_logits: int
    special: torch.Tensor  # [V] bool: special token ids and ids the tokenizer does not know
    eos: torch.Tensor  # [V] bool: the end-of-sequence set
    newline: torch.Tensor  # [V] bool: tokens whose text contains a newline
    angle_pipe: torch.Tensor  # [V] bool: tokens of the form <…|…>
    _stop_masks: dict[str, torch.Tensor] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    @classmethod
    def build(cls, tokenizer: Tokenizer, eos_ids: Iterable[int], num_logits: int | None = None) -> Vocabulary:
        """``eos_ids``: the checkpoint's end-of-sequence ids (``eos_token_id`` of its config, an int or a list);
        ``num_logits``: the model's vocabulary width (default: the tokenizer's size)."""
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        num_logits = size if num_logits is None else num_logits
        if num_logits < size:
            raise ValueError(f"the model has {num_logits} logits, fewer than the tokenizer's {size} tokens")
        texts = tuple(tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False))
        special = [i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special]
        special.extend(range(size, num_logits))
        ends = [i for i in (tokenizer.token_to_id(name) for name in END_TOKENS) if i is not None]
        return cls(
            texts=texts,
            num_logits=num_logits,
            special=_mask_of(special, num_logits),
            eos=_mask_of([*eos_ids, *ends], num_logits),
            newline=_mask_of([i for i, text in enumerate(texts) if "\n" in text], num_logits),
            angle_pipe=_mask_of([i for i, text in enumerate(texts) if _is_angle_pipe(text)], num_logits),
        )

    def stop_mask(self, stop_text: str) -> torch.Tensor:
        """The stop set of a `{*}` slot with this stop text ("" for none), [V] bool: the tokens whose text starts
        with its first character or that character's quote twin (`stop_characters`), every token containing a
        newline, the EOS set. Cached per first character."""
        first = stop_text[:1]
        if first not in self._stop_masks:
            chars = set(stop_characters(first))
            starts = [i for i, text in enumerate(self.texts) if text != "" and text[0] in chars]
            self._stop_masks[first] = _mask_of(starts, self.num_logits) | self.newline | self.eos
        return self._stop_masks[first]

    def forbidden_mask(self, stop_text: str) -> torch.Tensor:
        """What a `{*}` slot never continues with, [V] bool: its stop tokens, every special token id and every token
        of the form <…|…>."""
        return self.stop_mask(stop_text) | self.special | self.angle_pipe

    @functools.cached_property
    def number_table(self) -> NumberTable:
        """The grammar table of number slots, built on first use."""
        candidates = [i for i, text in enumerate(self.texts) if _is_number_candidate(text) and not self.special[i]]
        return _number_table(candidates, [self.texts[i] for i in candidates])


# tokenizer -> (EOS ids, logit width) -> its vocabulary
_cache: weakref.WeakKeyDictionary[Tokenizer, dict[tuple, Vocabulary]] = weakref.WeakKeyDictionary()


def vocabulary(tokenizer: Tokenizer, eos_ids: Iterable[int], num_logits: int | None = None) -> Vocabulary:
    """`Vocabulary.build` once per tokenizer object, EOS ids and logit width; the entry goes with the tokenizer."""
    key = (tuple(sorted(set(eos_ids))), num_logits)
    built = _cache.setdefault(tokenizer, {})
    if key not in built:
        built[key] = Vocabulary.build(tokenizer, key[0], num_logits)
    return built[key]


def _mask_of(ids: Iterable[int], size: int) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    mask[list(ids)] = True
    return mask


def _is_angle_pipe(text: str) -> bool:
    return len(text) >= 3 and text[0] == "<" and text[-1] == ">" and "|" in text[1:-1]


def _is_number_candidate(text: str) -> bool:
    return text in SCALE_WORDS or (text != "" and _ALPHABET.issuperset(text))


def _number_table(candidates: list[int], texts: list[str]) -> NumberTable:
    """Every state reachable from the two start states, in breadth-first order ({n} first), and its transitions."""
    states = [(False, START), (True, START)]
    index = {state: i for i, state in enumerate(states)}
    rows = []
    for currency_slot, state in states:  # grows while it is read: each new state is visited once
        row = []
        for text in texts:
            after = feed(state, text, currency_slot)
            if after is not None and (currency_slot, after) not in index:
                index[(currency_slot, after)] = len(states)
                states.append((currency_slot, after))
            row.append(-1 if after is None else index[(currency_slot, after)])
        rows.append(row)
    return NumberTable(
        candidates=torch.tensor(candidates, dtype=torch.int64),
        next_state=torch.tensor(rows, dtype=torch.int64).reshape(len(states), len(candidates)),
        complete=torch.tensor([complete(state) for _, state in states], dtype=torch.bool),
        states=tuple(states),
    )
