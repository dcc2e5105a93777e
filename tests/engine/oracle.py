"""An independent reading of engine spec Part A for scored queries, on plain transformers.

Every prompt is run alone as one sequence through ``AutoModelForCausalLM`` (eager attention, fp32) with the HF
tokenizer, each option spelling in one pass over the prompt and the spelling (the model is causal, so that pass's
rows are the chain rule's factors); nothing here imports the engine's compiler, trie, attention or model. The
rules (content join and cut, case variants, boundary rule, floors) are re-derived from the spec text so that a
shared misreading is unlikely.
"""

from __future__ import annotations

import itertools
import math
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class Oracle:
    def __init__(self, folder):
        self.hf_tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
        self.model.eval()
        self.bos = self.hf_tok("", add_special_tokens=True).input_ids
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def tok(self, text: str) -> list[int]:
        return self.hf_tok(text, add_special_tokens=False, split_special_tokens=True).input_ids if text else []

    def lp(self, prompt: list[int], spelling: list[int]) -> float:
        """log P(spelling | prompt) by the chain rule, every factor read from one plain forward pass of
        ``prompt + spelling[:-1]`` (causal: its row at position ``i`` is ``log P(. | seq[: i + 1])``)."""
        seq = tuple(prompt + spelling[:-1])
        if any(seq[: len(prompt) + t] not in self._rows for t in range(len(spelling))):
            with torch.no_grad():
                logits = self.model(torch.tensor([seq]), logits_to_keep=len(spelling)).logits[0].float()
            rows = torch.log_softmax(logits, dim=-1).double()
            for t in range(len(spelling)):
                self._rows[seq[: len(prompt) + t]] = rows[t]
        return sum(float(self._rows[seq[: len(prompt) + t]][token]) for t, token in enumerate(spelling))

    # -- spec rules -----------------------------------------------------------------------------------------

    @staticmethod
    def combinations(query: dict) -> list[dict[str, str]]:
        names = list(dict.fromkeys(re.findall(r"\{([A-Za-z0-9_]+)\}", query["template"])))
        combos = query.get("combinations")
        if combos is None:
            return [{}]
        if combos == "all":
            grids = [query["values"][n] for n in names]
            return [dict(zip(names, values, strict=True)) for values in itertools.product(*grids)]
        return combos

    @staticmethod
    def fill(template: str, values: dict[str, str]) -> str:
        text = template[: template.index("{?}")]
        for name, value in values.items():
            text = text.replace("{" + name + "}", value)
        return text

    def spellings(self, options: list[str], filled: list[str], case_insensitive: bool) -> list[list[list[int]]]:
        endings = list(dict.fromkeys(f[-32:] for f in filled))[:16]

        def clean(v):
            return all(self.tok(e + v) == self.tok(e) + self.tok(v) for e in endings)

        claimed, out = set(), []
        for option in options:
            kept = [self.tok(option)] if tuple(self.tok(option)) not in claimed else []
            claimed.add(tuple(self.tok(option)))
            if case_insensitive:
                b = option.strip()
                for word in (b.lower(), b[:1].upper() + b[1:].lower(), b.upper()):
                    for v in (" " + word, word):
                        t = tuple(self.tok(v))
                        if len(t) == 1 and t not in claimed and clean(v):
                            claimed.add(t)
                            kept.append(list(t))
            out.append(kept)
        return out

    def cut(self, text: str, content: list[int], firsts: list[str]) -> tuple[int | None, str]:
        """(content tokens kept in the prefix, tail text re-tokenized with each template); None = no cut."""
        tail = text[-256:]
        if not content or all(self.tok(tail + f) == self.tok(tail) + self.tok(f) for f in firsts):
            return None, ""
        offsets = self.hf_tok(text, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
        starts = [s for s, _ in offsets]
        best = None
        for k in range(max(0, len(starts) - 64), len(starts)):
            if len(text) - starts[k] >= 32 and self.tok(text[: starts[k]]) + self.tok(text[starts[k] :]) == content:
                best = k
        if best is not None:
            return best, text[starts[best] :]
        if len(text) <= 256:
            return 0, text
        return None, ""

    # -- whole request ----------------------------------------------------------------------------------------

    def score_input(self, text: str, queries: list[dict], scoring: dict) -> list[dict]:
        """Per query: per combination, option logprobs and floor logprobs (None when the floor is off)."""
        self._rows.clear()  # rows of one input's prompts (64 KiB each); another input shares almost none of them
        ci = scoring.get("case_insensitive", True)
        content = self.tok(text)
        filled_all = [[self.fill(q["template"], c) for c in self.combinations(q)] for q in queries]
        keep, tail = self.cut(text, content, [f[0] for f in filled_all])
        prefix = self.bos + (content if keep is None else content[:keep])
        out = []
        for q, filled in zip(queries, filled_all, strict=True):
            spellings = self.spellings(q["options"], filled, ci)
            floor_on = q.get("empty_floor")
            floor_on = scoring.get("empty_floor", True) if floor_on is None else floor_on
            combos = []
            for f in filled:
                prompt = prefix + (self.tok(f) if keep is None else self.tok(tail + f))
                main = [self._option_lp(prompt, s) for s in spellings]
                # a floor is a function of (filled text, options, case rule): its own ending alone decides
                own = self.spellings(q["options"], [f], ci)
                floor = [self._option_lp(self.bos + self.tok(f), s) for s in own] if floor_on else None
                combos.append((main, floor))
            out.append(combos)
        return out

    def _option_lp(self, prompt: list[int], spellings: list[list[int]]) -> float:
        lps = [self.lp(prompt, s) for s in spellings]
        top = max(lps)
        return top + math.log(sum(math.exp(x - top) for x in lps))


def derived(logprobs: list[float]) -> tuple[list[float], float]:
    """``p`` and ``residual`` from option logprobs (api spec §5.3)."""
    total = sum(math.exp(x) for x in logprobs)
    return [math.exp(x) / total for x in logprobs], max(0.0, 1.0 - total)
