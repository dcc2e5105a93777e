"""No setting is accepted and then ignored (issue 12 item 6): each one changes what ``spinf-serve serve`` builds.

`spinf.server.supervisor.run` is run for real up to the point where it would serve, with the server, the log set-up,
the engine class and the pack catalog's reader replaced by recorders: what it hands the server (`ServerOptions`, the
``/v1/models`` entry), the keyword arguments the engine is built with (`Engine.from_settings`), the log format, the
start-up log lines and the arguments the pack catalog is read with (at start, and on a reload). A setting whose first
sample (tests/settings_samples.py) changes none of these is inert. A setting whose feature is not built yet takes only
its default (tests/test_settings.py), so no value of it can be ignored. A setting of the reference that this engine has
no knob for (`Setting.no_effect`, api spec §9.1) must change none of these, and must be reported instead: given in any
layer, it gets a start-up line saying it has no effect here, and why (`serve` logs it: tests/test_cli.py).
"""

from __future__ import annotations

import logging

import attrs
import pytest

import spinf.engine.engine
import spinf.server.actors.pack_syncer
import spinf.server.logs
import spinf.server.supervisor
from spinf.catalog import resolve_model
from spinf.packs.catalog import Catalog
from spinf.settings import SETTING, SETTINGS, Settings, load_settings
from tests.settings_samples import SAMPLES, env_text

# Settings another change of issue 12 is wiring, with what they will drive: out of this list once that change is in.
PENDING: dict[str, str] = {}


class EngineRecorder:
    """Stands in for `Engine`: keeps the keyword arguments `Engine.from_settings` builds it with."""

    from_settings = classmethod(spinf.engine.engine.Engine.from_settings.__func__)

    def __init__(self, model, **kwargs):
        self.kwargs = {"model": model, **kwargs}


def what_serve_builds(settings: Settings, monkeypatch, caplog) -> tuple:
    handed = {}
    catalog_reads = []

    def fake_read_catalog(*args, **kwargs):
        catalog_reads.append((args, kwargs))
        return Catalog()

    def fake_run(function):
        options, load, models_entry = function.args
        packs = function.keywords["packs"]
        if packs.reread is not None:
            packs.reread(packs.refresh)  # a reload reads the same sources, as the pack syncer calls it
        # the entry's `created` is the start's second, which two starts need not share
        handed.update(options=options, engine=load().kwargs, models_entry=attrs.evolve(models_entry, created=0))
        return 0

    monkeypatch.setattr(spinf.server.logs, "configure", lambda log_format: handed.update(log_format=log_format))
    monkeypatch.setattr(spinf.engine.engine, "Engine", EngineRecorder)
    monkeypatch.setattr(spinf.server.supervisor.trio, "run", fake_run)
    monkeypatch.setattr(spinf.server.actors.pack_syncer, "read_catalog", fake_read_catalog)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spinf"):
        assert spinf.server.supervisor.run(settings, resolve_model(settings.engine.model)) == 0
    starts = ("spinf.server.supervisor", "spinf.server.actors.pack_syncer")  # the pack catalog's start is the syncer's
    lines = [r.getMessage() for r in caplog.records if r.name in starts]
    reads = [(args, {k: v for k, v in kwargs.items() if k != "environ"}) for args, kwargs in catalog_reads]
    return handed["options"], handed["engine"], handed["models_entry"], handed["log_format"], lines, reads


def with_value(settings: Settings, name: str, value: object) -> Settings:
    section = next(s.section for s in SETTINGS if s.name == name)
    return attrs.evolve(settings, **{section: attrs.evolve(getattr(settings, section), **{name: value})})


@pytest.mark.parametrize(
    "name", [s.name for s in SETTINGS if not (s.not_built or s.no_effect) and s.name not in PENDING]
)
def test_every_setting_changes_what_serve_builds(name, monkeypatch, caplog):
    defaults = Settings()
    assert what_serve_builds(with_value(defaults, name, SAMPLES[name][0]), monkeypatch, caplog) != (
        what_serve_builds(defaults, monkeypatch, caplog)
    ), f"{name} changes nothing that serve builds"


@pytest.mark.parametrize("name", [s.name for s in SETTINGS if s.no_effect])
def test_a_setting_with_no_effect_here_changes_nothing_serve_builds_and_is_reported(name, monkeypatch, caplog):
    setting, sample = SETTING[name], SAMPLES[name][0]
    given = load_settings({}, {setting.env[0]: env_text(name, sample)})
    assert given.value(name) == sample and given != Settings()
    assert what_serve_builds(given, monkeypatch, caplog) == what_serve_builds(Settings(), monkeypatch, caplog)
    literal = setting.literal(sample)
    assert given.notes == (
        f"engine.{name} = {literal} (env {setting.env[0]}): no effect on this engine: {setting.no_effect}",
    )
    assert setting.no_effect in setting.help  # --help and `config --toml` say so too


def test_the_start_up_line_names_the_pack_sources(monkeypatch, caplog):
    *_, lines, reads = what_serve_builds(Settings(), monkeypatch, caplog)
    assert lines[0].endswith("; pack sources: official")
    assert lines[1] == "packs: 0 versions of 0 ids enabled; sources: no pack source"
    assert [kwargs["refresh"] for _, kwargs in reads] == [False, False]  # the start, then a reload
    *_, reads = what_serve_builds(with_value(Settings(), "packs_refresh", True), monkeypatch, caplog)
    assert [kwargs["refresh"] for _, kwargs in reads] == [True, True]  # --packs-refresh: at every reload too
    given = with_value(Settings(), "packs", ("github:acme/packs@1", "/local/packs"))
    *_, lines, _ = what_serve_builds(given, monkeypatch, caplog)
    assert lines[0].endswith("; pack sources: official, github:acme/packs@1, /local/packs")
    *_, lines, reads = what_serve_builds(with_value(Settings(), "official_packs", False), monkeypatch, caplog)
    assert len(lines) == 1 and lines[0].endswith("; pack sources: off")
    assert reads == []  # packs off: no catalog is read
