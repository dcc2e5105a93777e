"""Random damage to a JSON value, for the tests that parsing never crashes (pack files, manifests)."""

from __future__ import annotations

import random

JSON_VALUES = [None, True, False, 0, -1, 2, 1.5, -0.0, "", "x", "c:rudeness", "a\x00b", [], [1], {}, {"a": 1}, ["a"]]


def mutate(value: object, rng: random.Random) -> object:
    """``value`` with one node somewhere replaced by a random JSON value, or a key dropped."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        if rng.random() < 0.15:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: mutate(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return value[:i] + [mutate(value[i], rng)] + value[i + 1 :]
    return rng.choice(JSON_VALUES)
