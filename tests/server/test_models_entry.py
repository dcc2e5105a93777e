"""The ``/v1/models`` entry (api spec §7) as `spinf.supervisor.models_entry_for` builds it from the layered settings:
capabilities are the manifest's minus what the switches turn off, the features follow them (``--no-extraction``
turns generation off too), and media is the model's kinds that ``--media`` keeps (the manifest's until the engine
is loaded, then the engine's). The served entry over a real socket is checked in tests/server/test_openapi.py,
tests/test_extraction_client.py and tests/test_media_client.py."""

from __future__ import annotations

import pytest

from spinf.catalog import resolve_model
from spinf.cli import _parser
from spinf.serving import Lifecycle
from spinf.settings import load_settings
from spinf.settings.flags import flags_from_args
from spinf.supervisor import models_entry_for


def entry(model: str, *flags: str, **env: str) -> dict:
    argv = ["serve", model, "--device", "cpu", *flags]
    settings = load_settings(flags_from_args(_parser().parse_args(argv)), env)
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
