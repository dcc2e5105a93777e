"""Job sets in the shapes of the reference figures (engine spec B.19), built deterministically from a seed.

J1: 24 news-like contents × 56 two-option questions (one template, 56 placeholder values). The texts are
generated from fixed phrase lists, so every run (and every machine) scores the same bodies.

Written job sets (``fixtures/jobsets/<name>.json``, original English prose, read with `load_jobset`): j1 = 24 news
articles of ~360 words (ids a00..a23) × 56 two-option questions (one template, 56 values of F); j2 = 256 user messages
of ~45 words (m000..m255) × 106 questions (one template, 106 values of C); j3 = one ~230-word article × 20 questions
(latency, 100 repeats); j4 = one ~9,000-word report × 20 questions (one template, 20 values of X).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

JOBSET_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "jobsets"

SUBJECTS = (
    "The city council",
    "The central bank",
    "A large shipping company",
    "The energy regulator",
    "Local farmers",
    "The transport ministry",
    "A group of investors",
    "The harbour authority",
    "Two airlines",
    "The trade union",
)
VERBS = (
    "announced",
    "rejected",
    "delayed",
    "approved",
    "questioned",
    "welcomed",
    "criticised",
    "confirmed",
)
OBJECTS = (
    "a new plan for the port",
    "higher fees for cargo ships",
    "a cut in interest rates",
    "the budget for next year",
    "a review of fuel prices",
    "the sale of the old rail yard",
    "new rules for electricity imports",
    "a strike at the main terminal",
    "a loan to the water company",
    "the merger of two regional banks",
)
DETAILS = (
    "on Tuesday",
    "after a long meeting",
    "despite strong protests",
    "in a short statement",
    "late last week",
    "for the second time this year",
    "according to people familiar with the talks",
    "without giving a reason",
)
PHRASES = (
    "oil prices",
    "the euro",
    "shipping costs",
    "port fees",
    "bank shares",
    "bread prices",
    "rents",
    "wages",
    "the stock market",
    "fuel demand",
    "interest rates",
    "house prices",
    "exports",
    "imports",
    "unemployment",
    "tourism",
    "airline fares",
    "electricity bills",
    "gas prices",
    "grain prices",
    "steel output",
    "car sales",
    "consumer confidence",
    "inflation",
    "the budget deficit",
    "public debt",
    "bond yields",
    "the dollar",
    "gold prices",
    "copper prices",
    "retail sales",
    "factory orders",
    "freight rates",
    "insurance costs",
    "tax revenue",
    "water bills",
    "train fares",
    "coffee prices",
    "sugar prices",
    "cotton prices",
    "shipping volumes",
    "container traffic",
    "port congestion",
    "cargo delays",
    "fishing quotas",
    "tourist arrivals",
    "hotel prices",
    "office rents",
    "construction costs",
    "mortgage rates",
    "credit card debt",
    "savings rates",
    "pension funds",
    "startup funding",
    "government spending",
    "household income",
)
J1_TEMPLATE = "\n\nAfter this news, {F} will probably{?}"
J1_OPTIONS = [" rise", " fall"]


def article(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        number = rng.randint(2, 98)
        out.append(
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(DETAILS)}, "
            f"and {number} percent of those asked said they expected {rng.choice(PHRASES)} to change."
        )
    return " ".join(out)


def j1_body(num_contents: int = 24, sentences: int = 11, seed: int = 1) -> dict:
    """A ``/v1/score`` body of the J1 shape: ``num_contents`` inputs, one query with 56 combinations."""
    rng = random.Random(seed)
    inputs = [
        {"id": f"a{i}", "messages": [{"role": "user", "content": article(rng, sentences)}]}
        for i in range(num_contents)
    ]
    query = {
        "id": "direction",
        "template": J1_TEMPLATE,
        "options": J1_OPTIONS,
        "combinations": [{"F": phrase} for phrase in PHRASES[:56]],
    }
    return {"inputs": inputs, "scoring": {"queries": [query]}}


def load_jobset(name: str) -> dict:
    """The ``/v1/score`` body of a written job set (``"j1"`` … ``"j4"``), from ``fixtures/jobsets/<name>.json``."""
    return json.loads((JOBSET_DIR / f"{name}.json").read_text(encoding="utf-8"))
