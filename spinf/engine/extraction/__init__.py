"""Extraction slots `{*}`, `{n}`, `{$}` and generated slots (engine spec A.12, A.13): the rules below the decoder.

The modules here hold what a decoder needs besides the model: ``grammar`` (the number grammar of A.12.4 as a pure
state machine), ``vocab`` (per-tokenizer tables: the number candidates and their transition table, the stop and
continuation masks of A.12.2, as tensors a decoder can use on the device) and ``answers`` (turning the strings a
search or a generation found into the response fields of api spec §5.4 and §5.5, pure Python). They are separate
from the search so each rule can be tested on its own, exhaustively where the rule allows it.
"""
