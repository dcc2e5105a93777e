"""The ``/v1/models`` entry (api spec §7) as `spinf.server.models_entry.models_entry_for` builds it from the layered
settings: capabilities are the manifest's minus what the switches turn off, the features follow them
(``--no-extraction`` turns generation off too), and media is the model's kinds that ``--media`` keeps (the manifest's
until the engine is loaded, then the engine's). The served entry over a real socket is checked in
tests/server/test_openapi.py, tests/test_extraction_client.py and tests/test_media_client.py."""

from __future__ import annotations

import time

import attrs
import pytest

from spinf.catalog import resolve_model
from spinf.cli import _parser
from spinf.server.lifecycle import Lifecycle
from spinf.server.models_entry import models_entry_for
from spinf.settings import load_settings
from spinf.settings.flags import flags_from_args


def settings_for(model: str, *flags: str, **env: str):
    argv = ["serve", model, "--device", "cpu", *flags]
    return load_settings(flags_from_args(_parser().parse_args(argv)), env)


def entry(model: str, *flags: str, **env: str) -> dict:
    settings = settings_for(model, *flags, **env)
    return models_entry_for(resolve_model(settings.engine.model), settings)(Lifecycle())


@pytest.mark.parametrize(
    ("flags", "capabilities", "extraction", "generation"),
    [
        ((), ["score", "extract", "generate"], True, True),
        (("--no-generation",), ["score", "extract"], True, False),
        (("--no-extraction",), ["score"], False, False),  # generation needs extraction
        (("--no-extraction", "--generation"), ["score"], False, False),
    ],
)
def test_capabilities_and_features_follow_the_switches(flags, capabilities, extraction, generation):
    found = entry("spinf/tiny-gemma4", *flags)
    assert found["capabilities"] == capabilities
    media = ["image", "audio", "video"]
    assert found["features"] == {"media": media, "extraction": extraction, "generation": generation}


def test_the_switches_from_the_environment_count_too():
    found = entry("spinf/tiny-gemma4", SPINF_GENERATION="false")
    assert found["capabilities"] == ["score", "extract"] and found["features"]["generation"] is False


def test_a_score_only_model_reports_score_only_whatever_the_switches():
    found = entry("spinf/pplx-decider-v1-27b-int4", "--extraction", "--generation")
    assert found["capabilities"] == ["score"]
    assert found["features"] == {"media": [], "extraction": False, "generation": False}


def test_media_is_the_models_kinds_that_the_media_setting_keeps():
    assert resolve_model("spinf/gemma-4-12b-fp8").media == ["image", "audio", "video"]
    found = entry("spinf/gemma-4-12b-fp8", "--media", "image,audio")
    assert found["media"] == found["features"]["media"] == ["image", "audio"]
    assert entry("spinf/gemma-4-31b-fp8", "--media", "audio,video")["media"] == ["video"]  # the 31B reads no audio
    assert entry("spinf/gemma-4-12b-fp8", "--no-media")["media"] == []
    assert list(found)[:9] == [
        "id",
        "name",
        "status",
        "base_model",
        "aliases",
        "family",
        "capabilities",
        "media",
        "limits",
    ]


# OpenAI's shape beside the entry (api spec §7): what the openai SDK's models.list() and models.retrieve() read.


def test_the_openai_entry_names_the_served_id_its_owner_and_a_time_fixed_for_the_process():
    served = models_entry_for(resolve_model("tiny"), settings_for("spinf/tiny-gemma4"))
    later = served.openai()
    assert later == {"id": "spinf/tiny-gemma4", "object": "model", "created": served.created, "owned_by": "spinf"}
    assert served.openai() == later and abs(served.created - time.time()) < 60  # made at the start, then fixed
    assert served(Lifecycle())["id"] == later["id"]


@pytest.mark.parametrize(
    ("name", "answers"),
    [
        ("spinf/tiny-gemma4", True),
        ("SPINF/Tiny-Gemma4", True),
        ("tiny", True),  # the manifest's alias
        ("TINY", True),
        ("spinf/tiny", False),
        ("tiny-gemma4", False),
        ("", False),
        ("spinf/gemma-4-12b-fp8", False),
    ],
)
def test_the_openai_entry_answers_to_the_models_names_in_any_case(name, answers):
    assert models_entry_for(resolve_model("spinf/tiny-gemma4"), settings_for("tiny")).answers_to(name) is answers


def test_a_served_model_name_is_the_id_and_the_manifest_names_still_answer():
    served = models_entry_for(resolve_model("tiny"), settings_for("tiny", SPINF_SERVED_MODEL="my-model"))
    assert served.openai()["id"] == served(Lifecycle())["id"] == "my-model"
    assert served.openai()["owned_by"] == "spinf"  # the name it is published under, not the local one
    assert all(served.answers_to(name) for name in ("MY-MODEL", "spinf/tiny-gemma4", "tiny"))


def test_a_checkpoint_outside_the_catalog_is_owned_by_its_hub_organisation_or_by_the_server(tmp_path):
    hub = resolve_model("acme-labs/gemma-4-tuned")
    assert hub.manifest is None
    entry = models_entry_for(hub, settings_for("acme-labs/gemma-4-tuned"))
    assert entry.openai()["owned_by"] == "acme-labs" and entry.answers_to("ACME-LABS/Gemma-4-Tuned")
    assert not entry.answers_to("spinf-12b")  # no manifest: no aliases
    local = attrs.evolve(hub, served_name=str(tmp_path), repo_id=None, local_folder=tmp_path)
    entry = models_entry_for(local, settings_for(str(tmp_path)))
    assert entry.openai() == {
        "id": str(tmp_path),
        "object": "model",
        "created": entry.created,
        "owned_by": "spinf-serve",
    }
