"""The micro-layer lock (packs spec §1.10, §11 item 1): the printed locks of §9, and ours equal to spinf-client's
``lock_of`` on the test packs and on variations that exercise the canonical text (floats, unicode, controls)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from spinf_client.packs import lock_of as client_lock_of

from spinf.packs.lock import canonical_text, lock_of, locked_content

FIXTURES = Path(__file__).parent / "fixtures"
TONE_LOCK = "sha256:39dfecd3359a5f7eb80dca208959e887fe879919c3592b23e8e52e5d98e4b71d"
HIDDEN_LOCK = "sha256:03da70c7d1a766cfb841a2a0378ac1b5f10b6a77f257c55d8d7368766d3f0853"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def hidden_variant() -> dict:
    """§9.5: acme/tone 1.0.1, with views, requires, decides and a two-unit hidden layer."""
    pack = fixture("tone.json")
    pack["version"], pack["answers"] = "1.0.1", "logprob"
    pack["reads"][2]["view"], pack["reads"][3]["view"] = "person", "group"
    pack["categories"]["targeted"].update(aggregate="views", threshold=0.004, requires=["rudeness"])
    pack["categories"]["rudeness"]["decides"] = False
    pack["decision"]["micro_layer"].update(
        hidden=2, weights="AAAAPwAAgL4AAIA/AABAPwAAAL8AAAA+zczMPc3MTL4AAMA/AAAAwM3MTD0AAAAA", lock=HIDDEN_LOCK
    )
    return pack


def test_the_test_vector_pack_has_the_printed_lock_and_canonical_text():
    pack = fixture("tone.json")
    text = canonical_text(locked_content(pack))
    assert len(text.encode()) == 886
    assert text.startswith(
        '{"inputs":["c:rudeness","c:targeted","r:r_rude"],"platt":{"rudeness":[1.1,-3.0],"targeted":[0.9,-2.5]},'
        '"queries":[{"id":"rude","options":[" yes"," no"],'
    )
    assert lock_of(pack) == TONE_LOCK == pack["decision"]["micro_layer"]["lock"]


def test_the_hidden_layer_variant_has_the_printed_lock():
    assert lock_of(hidden_variant()) == HIDDEN_LOCK


def _variations() -> dict[str, dict]:
    tone = fixture("tone.json")
    minimal = fixture("minimal.json")
    minimal["decision"]["micro_layer"] = {"inputs": ["c:off_topic"], "weights": "", "lock": ""}
    out = {"minimal_with_layer": minimal, "tone": tone, "hidden": hidden_variant()}

    def edit(name, change):
        pack = copy.deepcopy(tone)
        change(pack)
        out[name] = pack

    edit("mean_int", lambda p: p["reads"][0].update(mean=-2))
    edit("mean_edited", lambda p: p["reads"][0].update(mean=-1.9))
    edit("tiny_and_huge", lambda p: p["reads"][1].update(mu=[1e-05, 1e16, -0.0]))
    edit("unicode", lambda p: p["scoring"]["queries"][0].update(options=[" oui é", " 日本 😀"]))
    edit("controls", lambda p: p["scoring"]["queries"][0].update(template='a\t"b"\\c\x01\x7f/d\r\n\b\f{?}'))
    edit("extra_keys", lambda p: p["reads"][0].update(note={"z": 1, "a": [True, False, None]}))
    edit("weights_changed", lambda p: p["decision"]["micro_layer"].update(weights="AAAAAA=="))
    return out


@pytest.mark.parametrize("name", sorted(_variations()))
def test_our_lock_equals_spinf_clients(name):
    pack = _variations()[name]
    assert lock_of(pack) == client_lock_of(pack)


def test_a_pack_without_a_micro_layer_still_has_a_total_lock_function():
    """spinf-client's lock_of needs a micro-layer; ours hashes null inputs rather than failing (§2 has no lock)."""
    pack = fixture("minimal.json")
    assert lock_of(pack).startswith("sha256:") and len(lock_of(pack)) == 71


def test_what_the_lock_covers_and_what_it_does_not():
    packs = _variations()
    assert lock_of(packs["mean_int"]) != TONE_LOCK  # -2 and -2.0 lock differently
    assert lock_of(packs["mean_edited"]) != TONE_LOCK
    assert lock_of(packs["weights_changed"]) == TONE_LOCK
    edited = fixture("tone.json")
    edited["categories"]["rudeness"].update(threshold=0.1, label="x", normal_quantiles=None)
    edited["decision"].update(critical=[], max={"threshold": 0.9}, fallback="per_category")
    edited.update(version="9", model="other", contexts={"c": "{X}"}, answers="logprob")
    assert lock_of(edited) == TONE_LOCK
    edited["categories"]["targeted"]["platt"] = [0.9, -2.4]
    assert lock_of(edited) != TONE_LOCK
