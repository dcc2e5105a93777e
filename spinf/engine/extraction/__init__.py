"""Extraction slots `{*}`, `{n}`, `{$}` and generated slots (engine spec A.12, A.13): the rules below the decoder.

The modules here hold what a decoder needs besides the model: ``grammar`` (the number grammar of A.12.4 as a pure
state machine), ``vocab`` (per-tokenizer tables: the number candidates and their transition table, the stop and
continuation masks of A.12.2, as tensors a decoder can use on the device) and ``answers`` (turning the strings a
search or a generation found into the response fields of api spec §5.4 and §5.5, pure Python); ``search`` (the
best-first beam of A.12.3, vectorised over slots and their 6 rows, one step with no host read) and ``sampling`` (the
greedy and seeded generation of A.13) step on the log-probs a decoder gives them. Each rule is tested on its own,
exhaustively where the rule allows it. The engine does not call them yet: decoding from the scoring pass's captured
K/V (engine spec B.13, C.4) is still to come, and extraction slots are still refused with ``extraction_disabled``.
"""
