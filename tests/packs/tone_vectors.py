"""The test vectors of packs spec §9 (the ``acme/tone`` pack, its 1.0.1 hidden-layer variant and the one result) and
the minimal pack of §2, as plain data shared by the evaluator's tests and its conformance test."""

from __future__ import annotations

import copy
import json

TONE = json.loads(
    r"""
{"pack": "acme/tone", "version": "1.0.0", "model": "spinf/gemma-4-12b-fp8",
 "contexts": {"chat": "A chat message:\n{X}", "review": "A product review:\n{X}\n"},
 "scoring": {"queries": [
   {"id": "rude", "template": "\n\nIs this message rude?\nAnswer:{?}", "options": [" yes", " no"]},
   {"id": "tone", "template": "\n\nThe tone of this message is{?}", "options": [" neutral", " angry", " sarcastic"]},
   {"id": "aimed", "template": "\n\nIs this aimed at {F}?\nAnswer:{?}", "options": [" yes", " no"],
    "combinations": [{"F": "a person"}, {"F": "a group"}]}]},
 "reads": [
   {"id": "r_rude", "query": "rude", "kind": "pair", "category": "rudeness", "mean": -2.0, "sd": 1.5},
   {"id": "r_angry", "query": "tone", "kind": "set", "unsafe": [1, 2], "mu": [-0.2, -2.5, -3.0],
    "category": "rudeness", "mean": -1.0, "sd": 1.2},
   {"id": "r_person", "query": "aimed", "F": "a person", "kind": "pair", "category": "targeted", "mean": -1.0,
    "sd": 2.0},
   {"id": "r_group", "query": "aimed", "F": "a group", "kind": "pair", "category": "targeted", "mean": -1.5,
    "sd": 2.0}],
 "categories": {
   "rudeness": {"label": "Rudeness", "platt": [1.1, -3.0], "threshold": 0.6,
                "normal_quantiles": {"levels": [0.5, 0.9, 0.99], "values": [0.05, 0.2, 0.6]}},
   "targeted": {"label": "Targeted", "platt": [0.9, -2.5], "threshold": null}},
 "decision": {"mode": "micro_layer", "fallback": "max", "max": {"threshold": 0.5}, "critical": ["rudeness"],
   "micro_layer": {"inputs": ["c:rudeness", "c:targeted", "r:r_rude"],
                   "weights": "zcxMPwAAAD+amZk+AACAvwAAgD4=",
                   "lock": "sha256:39dfecd3359a5f7eb80dca208959e887fe879919c3592b23e8e52e5d98e4b71d"}}}
"""
)


def _option(text: str, logprob: float, p: float) -> dict:
    return {"text": text, "logprob": logprob, "p": p}


RESULT = {
    "input_id": "0",
    "queries": [
        {
            "id": "rude",
            "combinations": [{"values": {}, "options": [_option(" yes", -1.2, 0.3), _option(" no", -0.35, 0.7)]}],
        },
        {
            "id": "tone",
            "combinations": [
                {
                    "values": {},
                    "options": [
                        _option(" neutral", -0.5, 0.6),
                        _option(" angry", -1.4, 0.25),
                        _option(" sarcastic", -1.9, 0.15),
                    ],
                }
            ],
        },
        {
            "id": "aimed",
            "combinations": [
                {"values": {"F": "a person"}, "options": [_option(" yes", -1.0, 0.4), _option(" no", -0.6, 0.6)]},
                {"values": {"F": "a group"}, "options": [_option(" yes", -16.0, 0.0), _option(" no", 0.0, 1.0)]},
            ],
        },
    ],
}


def tone_logprob() -> dict:
    """§9.4: the same pack read from the options' logprobs (the lock is unchanged)."""
    pack = copy.deepcopy(TONE)
    pack["answers"] = "logprob"
    return pack


def tone_broken_lock() -> dict:
    """§9.3: ``reads[0].mean`` edited to −1.9, so the micro-layer lock no longer matches."""
    pack = copy.deepcopy(TONE)
    pack["reads"][0]["mean"] = -1.9
    return pack


def tone_hidden() -> dict:
    """§9.5: ``acme/tone`` 1.0.1, with views, ``requires``, ``decides: false`` and a two-unit hidden layer."""
    pack = tone_logprob()
    pack["version"] = "1.0.1"
    pack["reads"][2]["view"] = "person"
    pack["reads"][3]["view"] = "group"
    pack["categories"]["targeted"].update({"aggregate": "views", "threshold": 0.004, "requires": ["rudeness"]})
    pack["categories"]["rudeness"]["decides"] = False
    pack["decision"]["micro_layer"].update(
        {
            "hidden": 2,
            "weights": "AAAAPwAAgL4AAIA/AABAPwAAAL8AAAA+zczMPc3MTL4AAMA/AAAAwM3MTD0AAAAA",
            "lock": "sha256:03da70c7d1a766cfb841a2a0378ac1b5f10b6a77f257c55d8d7368766d3f0853",
        }
    )
    return pack


MINIMAL = {
    "pack": "example/off-topic",
    "version": "1.0.0",
    "model": "spinf/gemma-4-12b-fp8",
    "contexts": {"support": "A message sent to a customer-support chat:\n{X}"},
    "scoring": {
        "queries": [
            {
                "id": "on_topic",
                "template": "\n\nIs this message about our product or an order?\nAnswer:{?}",
                "options": [" no", " yes"],
            }
        ]
    },
    "reads": [
        {"id": "off_topic", "query": "on_topic", "kind": "pair", "category": "off_topic", "mean": 0.4, "sd": 2.2}
    ],
    "categories": {"off_topic": {"label": "Off topic", "platt": [1.5, -1.0], "threshold": 0.7}},
    "decision": {"mode": "per_category"},
}
