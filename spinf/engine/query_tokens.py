"""Compiling one scored query against the tokenizer: combinations, token checks, the boundary rule, spellings.

A compiled query does not depend on the input, so a shared query is compiled once per request. The checks run in
the order of api spec §4.8: filled-template length, the option list, option lengths, then the option boundary
rule; case variants that fail the rule are dropped silently (engine spec A.4.2–A.4.3).
"""

from __future__ import annotations

import attrs

from spinf.engine.tokenizer import TextTokenizer
from spinf.errors import bad_request
from spinf.protocol.queries import check_options, expand_combinations
from spinf.protocol.types import QuerySpec
from spinf.settings import Limits

ENDING_CHARS = 32  # the boundary rule looks at the last 32 characters of a filled template
MAX_ENDINGS = 16


@attrs.frozen
class CompiledQuery:
    """A query ready to lay out: its combinations, filled texts and tokens, and each option's kept spellings."""

    spec: QuerySpec
    combos: tuple[dict[str, str], ...]
    filled: tuple[str, ...]
    filled_tokens: tuple[tuple[int, ...], ...]
    option_tokens: tuple[tuple[int, ...], ...]  # each option as written, tokenized alone
    spellings: tuple[tuple[tuple[int, ...], ...], ...]  # per option: the token strings read for it
    case_insensitive: bool

    @property
    def flat_spellings(self) -> list[tuple[int, ...]]:
        return [s for per_option in self.spellings for s in per_option]

    @property
    def extracts(self) -> bool:
        """An extraction slot (``{*}``, ``{n}``, ``{$}``, generated or searched): no options, decoded instead."""
        return not self.spec.is_scored

    @property
    def reads_one_row(self) -> bool:
        """Every option and kept spelling is a single token (the query reads one row per prompt)."""
        return all(len(s) == 1 for s in self.flat_spellings)

    @property
    def extra_option_tokens(self) -> int:
        """Tokens of the options beyond their first, as counted in ``usage`` (api spec §5.7)."""
        return sum(len(t) - 1 for t in self.option_tokens)


def case_candidates(option: str) -> list[str]:
    """The six case and space variants of an option, in the spec's order, without repeats."""
    base = option.strip()
    cap = base[:1].upper() + base[1:].lower()
    out: list[str] = []
    for word in (base.lower(), cap, base.upper()):
        for candidate in (" " + word, word):
            if candidate not in out:
                out.append(candidate)
    return out


def filled_endings(filled: tuple[str, ...]) -> list[str]:
    """The distinct last-32-character endings of the filled templates, at most 16, in combination order."""
    endings: list[str] = []
    for text in filled:
        ending = text[-ENDING_CHARS:]
        if ending not in endings:
            endings.append(ending)
            if len(endings) == MAX_ENDINGS:
                break
    return endings


def _joins_cleanly(tk: TextTokenizer, endings, text: str, tokens: tuple[int, ...]) -> bool:
    """The boundary rule: ``tok(E + text) == tok(E) + tok(text)`` for every kept ending ``E``."""
    return all(tk.tok(e + text) == e_tokens + tokens for e, e_tokens in endings)


def spell_options(
    tk: TextTokenizer,
    options: tuple[str, ...],
    option_tokens: tuple[tuple[int, ...], ...],
    endings: list[tuple[str, tuple[int, ...]]],
    case_insensitive: bool,
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Each option's kept spellings (engine spec A.4.3): itself, then its single-token variants that pass the
    boundary rule on ``endings``; a spelling claimed by an earlier option is not counted again."""
    claimed: set[tuple[int, ...]] = set()
    spellings = []
    for option, tokens in zip(options, option_tokens, strict=True):
        kept = [tokens] if tokens not in claimed else []
        claimed.add(tokens)
        for candidate in case_candidates(option) if case_insensitive else ():
            c_tokens = tk.tok(candidate)
            if len(c_tokens) == 1 and c_tokens not in claimed and _joins_cleanly(tk, endings, candidate, c_tokens):
                kept.append(c_tokens)
                claimed.add(c_tokens)
        spellings.append(tuple(kept))
    return tuple(spellings)


def compile_query(q: QuerySpec, tk: TextTokenizer, limits: Limits, *, case_insensitive: bool) -> CompiledQuery:
    combos = expand_combinations(q)
    filled = tuple(q.template.fill(c) for c in combos)
    filled_tokens = tuple(tk.tok(text) for text in filled)
    for j, tokens in enumerate(filled_tokens):
        if len(tokens) > limits.max_query_tokens and q.pack is None:  # pack templates are exempt (api spec §4.8)
            raise bad_request(
                "template_too_long",
                f"{q.path}.combinations.{j}",
                f"the filled template has {len(tokens)} tokens; the limit is {limits.max_query_tokens}",
            )
    if not q.is_scored:  # an extraction slot: no options to check or spell
        return CompiledQuery(q, combos, filled, filled_tokens, (), (), case_insensitive)
    check_options(q, case_insensitive=case_insensitive, max_options=limits.max_options)
    options = q.options or ()
    option_tokens = tuple(tk.tok(o) for o in options)
    for j, tokens in enumerate(option_tokens):
        if not 1 <= len(tokens) <= limits.max_option_tokens:
            raise bad_request(
                "option_too_long",
                f"{q.path}.options.{j}",
                f"option {options[j]!r} is {len(tokens)} tokens; options must be 1 to {limits.max_option_tokens}",
            )
    endings = [(e, tk.tok(e)) for e in filled_endings(filled)]
    for j, (option, tokens) in enumerate(zip(options, option_tokens, strict=True)):
        if not _joins_cleanly(tk, endings, option, tokens):
            raise bad_request(
                "option_boundary",
                f"{q.path}.options.{j}",
                f"option {option!r} merges with the end of the template when tokenized; add or remove a leading "
                "space (templates should not end with whitespace; options usually start with a space)",
            )
    spellings = spell_options(tk, options, option_tokens, endings, case_insensitive)
    return CompiledQuery(q, combos, filled, filled_tokens, option_tokens, spellings, case_insensitive)


def check_answer_codes(cq: CompiledQuery, tk: TextTokenizer, codes: frozenset[int]) -> None:
    """On a decision model (engine spec A.15) every option must be one of its single-token answer codes: its
    readout puts all the mass on them, so any other option would have probability 0 and a log-probability of −∞,
    which no response may hold (api spec §2.1). Case variants that are not codes stay as spellings of no mass."""
    for j, (option, tokens) in enumerate(zip(cq.spec.options or (), cq.option_tokens, strict=True)):
        if len(tokens) != 1 or tokens[0] not in codes:
            shown = f"{len(tokens)} tokens" if len(tokens) != 1 else f"token {tk.decode(tokens)!r}, not a code"
            raise bad_request(
                "invalid_field",
                f"{cq.spec.path}.options.{j}",
                f"option {option!r} is {shown}: a decision model answers with its {len(codes)} single-token "
                "answer codes only",
            )
