"""The baseline the engine is measured against: plain transformers, each content's KV cache computed once and reused.

This is what a prefix-caching server does with a ``/v1/score`` body: for each input, one forward pass over BOS and
the content fills a KV cache; its questions then run in batches of ``batch`` rows, each batch on a copy of that cache
expanded to the batch (the content's keys and values are broadcast, then concatenated with the batch's own by the
cache's update). A row is a question's own tokens (its filled template), right-padded: a real token never attends to
the pads after it, so no padding mask is needed, and positions continue from the content's. Only the hidden states
where a token is read go through the LM head, soft-capping and an fp32 log-softmax.

Tokens are the engine's own (`spinf.engine.compiler.compile_request` with the engine's `TextTokenizer`): BOS and the
content (cut where the engine cuts it), each question's filled template, and each option's kept spellings (case
variants). A multi-token spelling extends its question's row by its lead-in tokens, as a server scoring an option as
a continuation would; a row that is a prefix of another is not run twice. A spelling's log-prob is the sum of its
tokens', an option's the log-sum-exp of its spellings', as the engine reports them (engine spec A.7). Floor prompts
(BOS and the filled template) run too, as one more content of BOS alone, so the baseline does the engine's work.

Works with transformers 5.17 (``past_key_values=``) and later (``cache=``), for Gemma 4 and for the Qwen3.5 hybrid
stack (whose linear-attention layers carry their conv and recurrent states in the cache); of a cache it touches
only ``layers`` and their tensors.
"""

from __future__ import annotations

import copy
import inspect
import math
import time

import attrs
import torch

from spinf.engine.compiler import EngineShape, compile_request
from spinf.engine.jobs import Prompt
from spinf.engine.results import logsumexp
from spinf.engine.tokenizer import TextTokenizer
from spinf.protocol.request import parse_score_request
from spinf.settings import Limits
from spinf.settings.table import DEFAULT_MAX_TOKENS, DEFAULT_TOKEN_BUDGET

DEFAULT_BATCH = 64
# the benchmarks' request limits: contents up to the engine maximum (J4 reads a ~17k-token report)
BENCH_LIMITS = Limits(max_content_tokens=DEFAULT_MAX_TOKENS)
PAD_ID = 0
PREFIX_ROW = -1  # a read at the content's last token (a question with no tokens of its own)

Spellings = tuple[tuple[tuple[int, ...], ...], ...]  # per option, per spelling: indices into Content.reads


@attrs.frozen
class Content:
    """One prefix run once, the rows run after it, and what is read where."""

    prefix: tuple[int, ...]  # BOS and the content tokens
    rows: tuple[tuple[int, ...], ...]  # distinct token rows after the prefix, one batch row each
    reads: tuple[tuple[int, int, int], ...]  # (row or PREFIX_ROW, position in the row, token)
    questions: tuple[Spellings, ...]


class _ContentBuilder:
    """Collects a content's questions; rows are the read contexts that no other context extends."""

    def __init__(self, prefix: tuple[int, ...]):
        self.prefix = prefix
        self.contexts: dict[tuple[tuple[int, ...], int], int] = {}  # (context, token) -> read index
        self.questions: list[Spellings] = []

    def add(self, prompt: Prompt) -> None:
        branch = tuple(prompt.branch)
        self.questions.append(
            tuple(
                tuple(tuple(self._read(branch + s[:t], token) for t, token in enumerate(s)) for s in per_option)
                for per_option in prompt.spellings
            )
        )

    def _read(self, context: tuple[int, ...], token: int) -> int:
        return self.contexts.setdefault((context, token), len(self.contexts))

    def build(self) -> Content:
        contexts = list(dict.fromkeys(c for c, _ in self.contexts))
        extended = {c[:k] for c in contexts for k in range(len(c))}
        rows = [c for c in contexts if c and c not in extended]
        row_of = {}
        for r, row in enumerate(rows):
            for k in range(1, len(row) + 1):
                row_of.setdefault(row[:k], r)
        reads = [
            (row_of[c], len(c) - 1, token) if c else (PREFIX_ROW, 0, token)
            for (c, token), _ in sorted(self.contexts.items(), key=lambda item: item[1])
        ]
        return Content(self.prefix, tuple(rows), tuple(reads), tuple(self.questions))


@attrs.frozen
class BaselinePlan:
    """A body's contents, and how many combinations each chosen query of each input has (to nest the values)."""

    contents: tuple[Content, ...]
    combinations: tuple[tuple[int, ...], ...]  # per input, per query

    @property
    def num_questions(self) -> int:
        return sum(sum(per_input) for per_input in self.combinations)

    def nest(self, values: list[list[list[float]]]) -> list:
        """Values per content -> per input, per query, per combination (the shape of the response's results)."""
        out = []
        for per_query, per_question in zip(self.combinations, values, strict=False):  # floors come last
            at, nested = 0, []
            for count in per_query:
                nested.append(per_question[at : at + count])
                at += count
            out.append(nested)
        return out


@attrs.frozen
class BaselineStats:
    passes: int  # forward calls: one per content, one per batch of rows
    tokens: int  # tokens run, pads included


def plan_baseline(
    tokenizer: TextTokenizer, body: dict, *, floors: bool = True, limits: Limits = BENCH_LIMITS
) -> BaselinePlan:
    """One `Content` per input, questions in response order (query, then combination); the floors last."""
    req = parse_score_request(body, limits=limits, trusted=True)
    compiled = compile_request(req, tokenizer, EngineShape(DEFAULT_TOKEN_BUDGET, DEFAULT_MAX_TOKENS))
    groups = [(ci.prefix, [p for per_query in ci.prompts for p in per_query]) for ci in compiled.inputs]
    if floors and compiled.floors:
        groups.append((tuple(tokenizer.bos), list(compiled.floors.values())))
    contents = []
    for prefix, prompts in groups:
        builder = _ContentBuilder(tuple(prefix))
        for prompt in prompts:
            builder.add(prompt)
        contents.append(builder.build())
    combinations = tuple(tuple(len(cq.combos) for cq in ci.queries) for ci in compiled.inputs)
    return BaselinePlan(tuple(contents), combinations)


def _cache_keyword(model) -> str:
    """transformers 5.17 calls the cache argument ``past_key_values``; later releases ``cache``."""
    return "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"


def _expanded(cache, rows: int):
    """A cache for a batch of ``rows``: its layers keep the content's state (lengths, windows) with the keys and
    values broadcast, not copied (each layer's update concatenates the batch's new keys onto them); every other
    tensor is the batch's own copy, one per row where it has a batch dimension of one: a hybrid model's conv and
    recurrent states (held in dicts by state index), and counters that a layer updates in place (transformers 5.25
    counts a linear-attention layer's tokens in a 0-d tensor with ``add_``), which must not move the content's."""
    out = copy.copy(cache)
    out.layers = [_expanded_layer(layer, rows) for layer in cache.layers]
    return out


def _expanded_layer(layer, rows: int):
    twin = copy.copy(layer)
    for name, value in vars(layer).items():
        if isinstance(value, torch.Tensor):
            setattr(twin, name, _own(value, rows, view=name in ("keys", "values")))
        elif isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values()):
            setattr(twin, name, {k: _own(v, rows) for k, v in value.items()})
        elif isinstance(value, list) and any(isinstance(v, torch.Tensor) for v in value):
            setattr(twin, name, [_own(v, rows) for v in value])
    return twin


def _own(value, rows: int, *, view: bool = False):
    """The batch's tensor for a cache tensor: a batch dimension of one widened to ``rows`` (a broadcast view for
    ``view``, else a copy), anything else copied; a non-tensor as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() == 0 or value.shape[0] != 1:
        return value.clone()
    wide = value.expand(rows, *value.shape[1:])
    return wide if view else wide.clone(memory_format=torch.contiguous_format)  # a copy even for one row


def assign_weights(model, state: dict[str, torch.Tensor], device: torch.device, *, tied: tuple[str, ...] = ()):
    """A transformers model built on ``meta`` made real on ``device``: the buffers that are no weights (rope
    frequencies, an embedding scale) recreated by the model's own initialiser, then ``state``'s weights assigned
    (already on ``device`` in their dtype). ``tied``: weights the model ties instead (missing from ``state``)."""
    for module in model.modules():
        meta = [name for name, buf in module.named_buffers(recurse=False) if buf is not None and buf.is_meta]
        for name in meta:
            module._buffers[name] = torch.empty_like(module._buffers[name], device=device)
        if meta:
            model._init_weights(module)  # its weights are still on meta, so only the buffers get values
    result = model.load_state_dict(state, assign=True, strict=False)
    if result.unexpected_keys or set(result.missing_keys) - set(tied):
        raise ValueError(f"the weights do not fit transformers' model: {result}")
    if tied:
        model.tie_weights()
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"tensors left on the meta device: {left}")
    return model.eval()


class Baseline:
    """Scores `Content`s on a transformers causal LM (``model.model`` the decoder, ``model.lm_head`` the head)."""

    def __init__(self, model, batch: int = DEFAULT_BATCH):
        from transformers import DynamicCache

        self.model = model
        self.batch = batch
        self.device = model.lm_head.weight.device
        text = model.config.get_text_config()  # a multimodal model (the tiny one, the 12B) nests it
        self.cap = getattr(text, "final_logit_softcapping", None)  # Gemma's soft-cap; Qwen3.5 has none
        self.cache_kw = _cache_keyword(model)
        self.new_cache = lambda: DynamicCache(config=text)

    def _tensor(self, data: list) -> torch.Tensor:
        """An int64 tensor on the device, copied from pinned memory without waiting for the GPU (a plain copy from
        pageable memory would synchronise, and leave the GPU idle while Python prepares the next batch)."""
        t = torch.tensor(data, dtype=torch.long)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _decode(self, ids: list[tuple[int, ...]], cache) -> torch.Tensor:
        """Hidden states (after the final norm) of right-padded rows of tokens. -> [rows, longest, hidden]"""
        longest = max(map(len, ids))
        padded = self._tensor([row + (PAD_ID,) * (longest - len(row)) for row in ids])
        out = self.model.model(input_ids=padded, use_cache=True, **{self.cache_kw: cache})
        return out.last_hidden_state

    def _read(self, hidden: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        """log P(token) at each hidden row. hidden [n, hidden] -> [n] fp32"""
        logits = self.model.lm_head(hidden).float()  # [n, vocab]
        if self.cap is not None:
            logits = torch.tanh(logits / self.cap) * self.cap
        logprobs = torch.log_softmax(logits, dim=-1)
        return logprobs.gather(1, self._tensor(tokens)[:, None])[:, 0]

    def _run_content(self, content: Content) -> tuple[torch.Tensor, int, int]:
        """The log-probs of the content's reads, in order; passes and tokens run."""
        cache = self.new_cache()
        last = self._decode([content.prefix], cache)[0, -1:]  # [1, hidden]
        passes, tokens = 1, len(content.prefix)
        values = torch.empty(len(content.reads), device=self.device)
        at_prefix = [i for i, (row, _, _) in enumerate(content.reads) if row == PREFIX_ROW]
        if at_prefix:
            found = self._read(last.expand(len(at_prefix), -1), [content.reads[i][2] for i in at_prefix])
            values[self._tensor(at_prefix)] = found
        reads_of_row: list[list[int]] = [[] for _ in content.rows]
        for i, (row, _, _) in enumerate(content.reads):
            if row != PREFIX_ROW:
                reads_of_row[row].append(i)
        # shortest first, so a batch's rows have similar lengths and little padding
        order = sorted(range(len(content.rows)), key=lambda r: len(content.rows[r]))
        for start in range(0, len(order), self.batch):
            members = order[start : start + self.batch]
            hidden = self._decode([content.rows[r] for r in members], _expanded(cache, len(members)))
            wanted = [i for r in members for i in reads_of_row[r]]
            batch_row = {r: b for b, r in enumerate(members)}
            at_b = self._tensor([batch_row[content.reads[i][0]] for i in wanted])
            at_pos = self._tensor([content.reads[i][1] for i in wanted])
            found = self._read(hidden[at_b, at_pos], [content.reads[i][2] for i in wanted])
            values[self._tensor(wanted)] = found
            passes, tokens = passes + 1, tokens + hidden.shape[0] * hidden.shape[1]
        return values, passes, tokens

    @torch.inference_mode()
    def score(self, contents: tuple[Content, ...]) -> tuple[list[list[list[float]]], BaselineStats]:
        """Per content, per question: the options' log-probs (in the question's option order)."""
        passes, tokens, found = 0, 0, []
        for content in contents:
            values, content_passes, content_tokens = self._run_content(content)
            found.append(values)
            passes, tokens = passes + content_passes, tokens + content_tokens
        # one device-to-host copy at the end, as a server reads its results asynchronously
        flat = torch.cat(found).double().cpu().tolist() if found else []
        out, at = [], 0
        for content in contents:
            reads = flat[at : at + len(content.reads)]
            at += len(content.reads)
            out.append(
                [
                    [logsumexp([math.fsum(reads[i] for i in spelling) for spelling in per_option]) for per_option in q]
                    for q in content.questions
                ]
            )
        return out, BaselineStats(passes, tokens)


def run_baseline_stats(
    model, tokenizer: TextTokenizer, body: dict, batch: int = DEFAULT_BATCH, *, floors: bool = True
) -> tuple[list, BaselineStats, float]:
    """`run_baseline` with the pass and token counts."""
    started = time.perf_counter()
    plan = plan_baseline(tokenizer, body, floors=floors)
    values, stats = Baseline(model, batch).score(plan.contents)
    seconds = time.perf_counter() - started
    return plan.nest(values), stats, seconds


def run_baseline(
    model, tokenizer: TextTokenizer, body: dict, batch: int = DEFAULT_BATCH, *, floors: bool = True
) -> tuple[list, float]:
    """Score ``body`` with the baseline: (log-probs per input, per query, per combination, per option; seconds).

    The time covers compiling the body's tokens and every forward pass, up to the values on the host. With
    ``floors`` the floor prompts run as well (their values are not returned), as the engine runs them.
    """
    logprobs, _, seconds = run_baseline_stats(model, tokenizer, body, batch, floors=floors)
    return logprobs, seconds
