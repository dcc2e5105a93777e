"""An independent reading of engine spec A.12 and A.13 on plain transformers, for the decode exactness tests.

Every distribution is the fp32 log-softmax of the last row of a plain full forward pass (``AutoModelForCausalLM``,
eager attention, fp32, no key/value cache) over the whole sequence: BOS, content, template text, the tokens so far.
The rules (stop and forbidden sets, the best-first beam, the number grammar, greedy and seeded sampled generation,
answer merging and the response fields) are re-derived here from the spec text; nothing is imported from spinf's
extraction modules, so a misreading shared by both sides is unlikely.
"""

from __future__ import annotations

import math
import string
import unicodedata

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

BEAM = TOPK = 6
MIN_P, REL_P = 0.002, 0.02
END_NAMES = ("<end_of_turn>", "<turn|>", "<|im_end|>", "<|endoftext|>")
TWINS = {'"': "”", "'": "’"}
ALPHABET = set(" 0123456789.,%()-−$€£¥")
SCALES = {" thousand": 1e3, " million": 1e6, " billion": 1e9}
DIGITS = set("0123456789")


class Reference:
    def __init__(self, folder):
        self.hf_tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
        self.model.eval()
        self.bos = self.hf_tok("", add_special_tokens=True).input_ids
        vocab = self.model.config.get_text_config().vocab_size
        self.texts = [self.decode([i]) for i in range(vocab)]
        special = {i for i, t in self.hf_tok.added_tokens_decoder.items() if t.special}
        self.special = special | set(self.hf_tok.all_special_ids)
        eos = {
            self.model.config.get_text_config().eos_token_id,
            self.model.generation_config.eos_token_id,
            self.hf_tok.eos_token_id,
        }
        for name in END_NAMES:
            i = self.hf_tok.convert_tokens_to_ids(name)
            if i is not None and i != self.hf_tok.unk_token_id:
                eos.add(i)
        self.eos = {i for e in eos if e is not None for i in (e if isinstance(e, list) else [e])}
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        self.forwards = 0

    def tok(self, text: str) -> list[int]:
        return self.hf_tok(text, add_special_tokens=False, split_special_tokens=True).input_ids if text else []

    def decode(self, ids) -> str:
        return self.hf_tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # -- distributions --------------------------------------------------------------------------------------

    def logprobs(self, seqs: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Per sequence, the fp32 log-softmax [V] after its last token, from a plain full forward (batched when the
        sequences have one length; the model is causal, so a sequence's last row sees only its own tokens)."""
        todo = sorted({tuple(s) for s in seqs if tuple(s) not in self._memo})
        by_length: dict[int, list[tuple[int, ...]]] = {}
        for s in todo:
            by_length.setdefault(len(s), []).append(s)
        for batch in by_length.values():
            # denormal activations (long repetitive paths of the random model) make CPU GEMMs a hundred times
            # slower; flushing them moves a log-prob by far less than any tolerance here. The flag is per thread,
            # so the forward runs on this one.
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            torch.set_flush_denormal(True)
            try:
                with torch.no_grad():
                    logits = self.model(torch.tensor(batch), logits_to_keep=1).logits[:, -1].float()
            finally:
                torch.set_flush_denormal(False)
                torch.set_num_threads(threads)
            self.forwards += 1
            for s, row in zip(batch, torch.log_softmax(logits, dim=-1), strict=True):
                self._memo[s] = row
        return [self._memo[tuple(s)] for s in seqs]

    # -- A.12.2 ---------------------------------------------------------------------------------------------

    def stop_ids(self, stop_text: str) -> set[int]:
        first = stop_text[:1]
        chars = {first, TWINS[first]} if first in TWINS else ({first} if first else set())
        starts = {i for i, t in enumerate(self.texts) if t and t[0] in chars}
        newline = {i for i, t in enumerate(self.texts) if "\n" in t}
        return starts | newline | self.eos

    def forbidden_ids(self, stop_text: str) -> set[int]:
        angle = {i for i, t in enumerate(self.texts) if len(t) >= 3 and t[0] == "<" and t[-1] == ">" and "|" in t}
        return self.stop_ids(stop_text) | self.special | angle

    def masks(self, stop_text: str) -> tuple[torch.Tensor, torch.Tensor]:
        vocab = len(self.texts)
        stop, forbidden = torch.zeros(vocab, dtype=torch.bool), torch.zeros(vocab, dtype=torch.bool)
        stop[sorted(self.stop_ids(stop_text))] = True
        forbidden[sorted(self.forbidden_ids(stop_text))] = True
        return stop, forbidden

    # -- A.13 -----------------------------------------------------------------------------------------------

    def greedy(self, prompt: list[int], max_tokens: int, stop_text: str):
        """(tokens, finish, smallest margin): the A.13 greedy rule on the reference's distributions. The margin is
        the smallest gap, in log-prob, between the choice made and the one not made (argmax vs runner-up, or stop
        vs best token), so a near tie is visible."""
        stop, forbidden = self.masks(stop_text)
        tokens: list[int] = []
        margin = math.inf
        while len(tokens) < max_tokens:
            lp = self.logprobs([tuple(prompt + tokens)])[0].double()
            end = torch.logsumexp(lp[stop], 0).item()
            allowed = lp.masked_fill(forbidden, -math.inf)
            two = torch.topk(allowed, 2)
            best, second = two.values.tolist()
            margin = min(margin, abs(end - best), best - second)
            if end >= best:
                return tokens, "stop", margin
            tokens.append(int(two.indices[0]))
        return tokens, "length", margin

    def sample(self, prompt, max_tokens, stop_text, *, temperature, top_p=1.0, top_k=40, seed=0, sequence=0):
        """One sampled sequence of A.13: candidates are the end event and the ``top_k`` best tokens; log-probs over
        the temperature, renormalised, the smallest nucleus covering ``top_p``, drawn with NumPy's default
        generator seeded ``[seed, sequence]`` (one ``random()`` per step, searched in the nucleus's cumulative sum
        by probability order, the end event first among equals)."""
        stop, forbidden = self.masks(stop_text)
        rng = np.random.default_rng([seed, sequence])
        tokens: list[int] = []
        while len(tokens) < max_tokens:
            u = rng.random()
            lp = self.logprobs([tuple(prompt + tokens)])[0].double()
            end = torch.logsumexp(lp[stop], 0).item()
            vals, ids = torch.topk(lp.masked_fill(forbidden, -math.inf), top_k)
            events = [(end, -1)] + [(v, int(i)) for v, i in zip(vals.tolist(), ids.tolist(), strict=True)]
            weights = [math.exp(v / temperature) if v > -math.inf else 0.0 for v, _ in events]
            total = sum(weights)
            ranked = sorted(range(len(events)), key=lambda j: -weights[j])  # stable: the end event first in a tie
            kept, cum = [], 0.0
            for j in ranked:
                if cum >= top_p:
                    break
                kept.append(j)
                cum += weights[j] / total
            mass = sum(weights[j] for j in kept)
            acc, choice = 0.0, kept[-1]
            for j in kept:
                acc += weights[j] / mass
                if u < acc:
                    choice = j
                    break
            if events[choice][1] < 0:
                return tokens, "stop"
            tokens.append(events[choice][1])
        return tokens, "length"

    # -- A.12.3 ---------------------------------------------------------------------------------------------

    def search(self, prompt: list[int], max_tokens: int, *, stop_text: str = "", number: str | None = None):
        """The best-first beam of A.12.3: every answer recorded, ``{tokens: log-prob}``, and the number of decode
        steps that had a live beam after them. ``number``: None (a `{*}` slot), ``"n"`` or ``"$"``."""
        if number is None:
            stop, forbidden = self.masks(stop_text)
        else:
            cands = sorted(i for i, t in enumerate(self.texts) if i not in self.special and is_candidate(t))
        beams = [((), 0.0, START)]  # (tokens, summed log-prob, grammar state), best first
        answers: dict[tuple[int, ...], float] = {}
        best = -math.inf
        steps = 0
        for t in range(max_tokens + 1):
            rows = self.logprobs([tuple(prompt) + tokens for tokens, _, _ in beams])
            proposals = []
            for rank_beam, ((tokens, s, state), lp) in enumerate(zip(beams, rows, strict=True)):
                lp64 = lp.double()
                if number is None:
                    if tokens:
                        answers[tokens] = s + torch.logsumexp(lp64[stop], 0).item()
                        best = max(best, answers[tokens])
                    allowed = lp.masked_fill(forbidden, -math.inf)
                    options = [(int(i), None) for i in _top(allowed, TOPK)]
                else:
                    valid = [(i, nxt) for i in cands if (nxt := feed(state, self.texts[i], number == "$")) is not None]
                    if complete(state):
                        taken = math.fsum(math.exp(lp64[i].item()) for i, _ in valid)
                        answers[tokens] = s + (math.log1p(-taken) if valid else 0.0)
                        best = max(best, answers[tokens])
                    order = sorted(range(len(valid)), key=lambda k: (-lp[valid[k][0]].item(), valid[k][0]))
                    options = [valid[k] for k in order[:TOPK]]
                for rank, (i, nxt) in enumerate(options):
                    if lp[i].item() > -math.inf:
                        proposals.append((s + lp64[i].item(), rank_beam, rank, tokens + (i,), nxt))
            if t == max_tokens:
                break
            floor = math.log(max(MIN_P, REL_P * math.exp(best)))
            kept = sorted((p for p in proposals if p[0] >= floor), key=lambda p: (-p[0], p[1], p[2]))[:BEAM]
            beams = [(toks, s, nxt) for s, _, _, toks, nxt in kept]
            if not beams:
                break
            steps += 1
        return answers, steps


def _top(values: torch.Tensor, k: int) -> list[int]:
    """The ``k`` best indices, larger first, ties to the lower index."""
    order = sorted(range(values.shape[0]), key=lambda i: (-values[i].item(), i)) if values.shape[0] <= k else None
    if order is not None:
        return order[:k]
    cut = torch.topk(values, k).values[-1].item()  # every value tied with the k-th is considered
    near = (values >= cut).nonzero().flatten().tolist()
    return sorted(near, key=lambda i: (-values[i].item(), i))[:k]


# -- A.12.4, written from the table ---------------------------------------------------------------------------

START = ("start", False, False, False, False)  # (phase, open bracket, negative, currency seen, spaced)


def is_candidate(text: str) -> bool:
    return text in SCALES or (text != "" and set(text) <= ALPHABET)


def feed(state, text: str, currency_slot: bool):
    """The state after a candidate token's whole text, or None if it is no valid extension."""
    if text in SCALES:
        return _symbol(state, "SCALE", currency_slot)
    for char in text:
        state = _symbol(state, char, currency_slot)
        if state is None:
            return None
    return state


def _symbol(state, c: str, cur_slot: bool):
    phase, bracket, negative, currency, spaced = state
    is_cur = cur_slot and c in "$€£¥"
    if phase == "start":
        if c == " " and not spaced:
            return ("start", bracket, negative, currency, True)
        if c in "-−(":
            return ("pre_sign", c == "(", True, currency, False)
        if is_cur:
            return ("pre_cur", bracket, negative, True, False)
        if c in DIGITS:
            return ("int", bracket, negative, currency, False)
        return None
    if phase in ("pre_sign", "pre_cur", "pre_space"):
        if is_cur and not currency:
            return ("pre_cur", bracket, negative, True, False)
        if c == " " and phase == "pre_cur":  # one space directly after the currency symbol
            return ("pre_space", bracket, negative, currency, True)
        if c in DIGITS:
            return ("int", bracket, negative, currency, False)
        return None
    if phase == "int":
        if c in DIGITS:
            return state
        if c == ",":
            return ("comma", bracket, negative, currency, False)
        if c == ".":
            return ("dot", bracket, negative, currency, False)
    if phase == "comma":
        return ("int", bracket, negative, currency, False) if c in DIGITS else None
    if phase == "dot":
        return ("frac", bracket, negative, currency, False) if c in DIGITS else None
    if phase == "frac" and c in DIGITS:
        return state
    if phase in ("int", "frac") and c in ("%", "SCALE"):
        return ("post", bracket, negative, currency, False)
    if phase in ("int", "frac", "post") and c == ")" and bracket:
        return ("closed", False, negative, currency, False)
    return None


def complete(state) -> bool:
    return state[0] in ("int", "dot", "frac", "post", "closed") and not state[1]


# -- A.12.5 and A.13's finish rule ----------------------------------------------------------------------------


def text_key(text: str) -> str:
    chars = [" " if c in string.punctuation or unicodedata.category(c).startswith("P") else c for c in text.lower()]
    return "".join(w for w in "".join(chars).split() if w not in ("a", "an", "the"))


def value_of(text: str) -> float | None:
    import re

    m = re.search(r"\d[\d,]*(\.\d+)?", text)
    if m is None:
        return None
    value = float(m.group().replace(",", ""))
    rest = text[m.end() :]
    for word, factor in SCALES.items():
        if rest.startswith(word):
            value *= factor
    body = text.lstrip()
    if body[:1] in "$€£¥" and body:
        body = body[1:].lstrip()
    return -value if body[:1] in ("-", "−", "(") else value


def combination(kind: str, found: list[tuple[str, float]], top_k: int = 5, calibration=None) -> dict:
    """The fields of one searched combination (A.12.5), unrounded: answers [(text, p, value, currency)], mass,
    p_negative, p_calibrated."""
    answers = [(text.strip(), math.exp(lp)) for text, lp in found]
    if kind != "text":
        answers = [(t, p) for t, p in answers if value_of(t) is not None]

    def key(t):
        if kind == "text":
            return text_key(t)
        cur = next((c for c in t if c in "$€£¥"), None) if kind == "currency" else None
        return (round(value_of(t), 9), cur)

    groups: dict = {}
    for t, p in answers:
        groups.setdefault(key(t), {}).setdefault(t, 0.0)
        groups[key(t)][t] += p
    merged = []
    for forms in groups.values():
        shown = max(forms, key=lambda t: forms[t])
        merged.append((shown, sum(forms.values())))
    merged.sort(key=lambda g: -g[1])
    out = {"answers": merged[:top_k], "mass": sum(p for _, p in answers)}
    if merged and kind != "text":
        top = abs(value_of(merged[0][0]))
        same = [(value_of(t), p) for t, p in merged if abs(abs(value_of(t)) - top) <= 1e-9 * top]
        total = sum(p for _, p in same)
        out["p_negative"] = None if total == 0 else sum(p for v, p in same if v < 0) / total
    if merged and calibration is not None:
        a, b = calibration
        p = min(max(merged[0][1], 1e-9), 1 - 1e-9)
        out["p_calibrated"] = 1 / (1 + math.exp(-(a * math.log(p / (1 - p)) + b)))
    return out


def finished_text(text: str, last_token: str, stop_text: str) -> str:
    """A.13: trimmed, the stop quote removed when it ended up inside the last token (and trailing copies)."""
    first = stop_text[:1]
    quotes = first + TWINS.get(first, "") if first in ("'", '"') else ""
    if quotes and last_token and text.endswith(last_token):
        inside = [last_token.index(q) for q in quotes if q in last_token]
        if inside:
            text = text[: len(text) - len(last_token) + min(inside)]
    return text.strip().rstrip(quotes).strip() if quotes else text.strip()
