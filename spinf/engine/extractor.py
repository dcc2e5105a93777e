"""The engine's extraction side: a compiled slot becomes a decoder task, a decoded slot becomes its result entry.

`Extractor` holds what every slot of one engine shares: the tokenizer's extraction vocabulary (stop and
continuation masks, the number grammar, `spinf.engine.extraction.vocab`), the model and the decoder budget. The
engine loop hands it the slots whose passes have run (`tasks`), decodes them (`decode`) and builds each extraction
query's entry of api spec §5.2 from the outcomes (`query_entry`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from spinf.engine.compiler import CompiledInput, slot_tokens
from spinf.engine.extraction.answers import Generated, generated_combination, searched_combination
from spinf.engine.extraction.decoder import Captured, Decoded, DecodeTally, SlotStart, SlotTask, decode
from spinf.engine.extraction.sampling import GenerateSlot
from spinf.engine.extraction.search import SearchSlot
from spinf.engine.extraction.vocab import vocabulary
from spinf.engine.jobs import Prompt
from spinf.engine.tokenizer import TextTokenizer
from spinf.protocol.types import Slot
from spinf.settings import SETTING

# held keys and values before slots are decoded early (api spec §9.2), and a decode chunk's working set
DEFAULT_DECODE_BUDGET_GIB = SETTING["decode_budget_gib"].default
DEFAULT_DECODER_BUDGET_GIB = SETTING["decoder_budget_gib"].default
DEFAULT_TOP_K = 5  # answers per searched slot when the query sends no top_k (api spec §4.5)


class Extractor:
    def __init__(
        self,
        model,
        tokenizer: TextTokenizer,
        eos_ids,
        *,
        decode_budget_gib: float = DEFAULT_DECODE_BUDGET_GIB,
        decoder_budget_gib: float = DEFAULT_DECODER_BUDGET_GIB,
        kernel_plan: Callable | None = None,
        context: Callable | None = None,
        graphs: bool = False,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.vocabulary = vocabulary(tokenizer.plain, eos_ids, model.cfg.vocab_size)
        self.decode_budget = int(decode_budget_gib * 2**30)
        self.decoder_budget = int(decoder_budget_gib * 2**30)
        self.kernel_plan, self.context, self.graphs = kernel_plan, context, graphs
        self.cost = model.capture_cost()  # what the decoder holds per token and per prefix
        # Measurement only, never a setting (benchmarks/extraction.py): random weights spread the next-token mass so
        # thin that every beam is pruned and every sequence ends at once; with ``full_length`` beams are never
        # pruned and nothing ends before ``max_tokens``, so a slot's full cost can be timed.
        self.full_length = False
        self.tally = DecodeTally()  # what every decode ran, summed (benchmarks/extraction.py reads it)
        self._masks: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _text_masks(self, stop_text: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A `{*}` slot's stop and continuation masks on ``device``, kept per first stop character."""
        key = (stop_text[:1], device)
        if key not in self._masks:
            vocab = self.vocabulary
            self._masks[key] = (vocab.stop_mask(stop_text).to(device), vocab.forbidden_mask(stop_text).to(device))
        stop, forbidden = self._masks[key]
        return (torch.zeros_like(stop) if self.full_length else stop), forbidden

    def task(self, prompt: Prompt, captured: Captured, start: SlotStart) -> SlotTask:
        """The decoder task of one extraction prompt, from where its pass captured it."""
        spec = prompt.query.spec
        device = captured.logprobs.device
        max_tokens = slot_tokens(prompt.query)
        slot = spec.template.slot
        if spec.generate is not None:
            stop, forbidden = self._text_masks(spec.template.stop_text, device)
            g = spec.generate
            return SlotTask(
                captured,
                start,
                generate=GenerateSlot(
                    max_tokens,
                    stop,
                    forbidden,
                    temperature=g.temperature,
                    top_p=g.top_p,
                    top_k=g.top_k,
                    seed=g.seed,
                    n=g.n,
                ),
            )
        if slot is Slot.TEXT:
            stop, forbidden = self._text_masks(spec.template.stop_text, device)
            return SlotTask(captured, start, search=SearchSlot(max_tokens, stop=stop, forbidden=forbidden))
        table = self.vocabulary.number_table
        return SlotTask(captured, start, search=SearchSlot(max_tokens, start=table.start(slot is Slot.CURRENCY)))

    def decode(self, tasks: list[SlotTask]) -> tuple[list[Decoded], float]:
        return decode(
            self.model,
            tasks,
            self.vocabulary,
            budget=self.decoder_budget,
            kernel_plan=self.kernel_plan,
            context=self.context,
            graphs=self.graphs,
            tally=self.tally,
            **({"min_p": 0.0, "rel_p": 0.0} if self.full_length else {}),
        )

    def capture_tokens(self) -> int:
        """How many prefix rows' worth of keys and values (`CaptureCost.units`) one pass may keep for its slots: the
        decode budget's worth."""
        return self.decode_budget // self.cost.prefix_token

    def capture_units(self, job) -> int:
        """What a job's pass keeps for its slots (its prefix, the paths to its slots' starts), in prefix rows."""
        return self.cost.units(len(job.prefix), job.path_nodes())

    def query_entry(self, ci: CompiledInput, qi: int, decoded: dict[int, Decoded]) -> dict:
        """The result entry of one chosen extraction query (api spec §5.2) from its prompts' outcomes."""
        cq = ci.queries[qi]
        spec = cq.spec
        kind = spec.template.slot.kind
        decode_text = self.tokenizer.decode
        combinations = []
        for k, combo in enumerate(cq.combos):
            outcome = decoded[id(ci.prompts[qi][k])]
            if spec.generate is not None:
                sequences = [
                    Generated(decode_text(tokens), decode_text(tokens[-1:]) if tokens else "", finish)
                    for tokens, finish in outcome.sequences
                ]
                combinations.append(generated_combination(dict(combo), sequences, spec.template.stop_text))
            else:
                found = [(decode_text(tokens), lp) for tokens, lp in outcome.answers]
                combinations.append(
                    searched_combination(kind, dict(combo), found, spec.top_k or DEFAULT_TOP_K, spec.calibration)
                )
        entry = {"id": spec.id, "kind": kind}
        if spec.generate is not None:
            entry["generate"] = True
        entry["combinations"] = combinations
        return entry


def cpu_context(device: torch.device) -> Callable | None:
    """What wraps a decode step on ``device``: one intra-op thread on the CPU (`spinf.engine.scorer`), else nothing."""
    if device.type != "cpu":
        return None
    from spinf.engine.scorer import one_cpu_thread

    return lambda: one_cpu_thread(device)
