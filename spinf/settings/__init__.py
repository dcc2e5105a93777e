"""Settings: every knob of a deployment, layered, checked and frozen (api spec §9).

``SETTINGS`` is the one table of settings: name, section, kind (parser and checker), default, flags, environment
names and help. The environment reader, the TOML reader, the frozen tree (``Settings``: ``engine``, ``server``,
``features``, ``limits``) and, in ``spinf.settings.flags``, the command-line flags, the origin listing and the TOML
writer all come from it, so a setting cannot exist in one place and be missing in another. ``load_settings`` layers
them, first value wins: command-line flag > environment variable (an empty string counts as unset) > TOML file
(``--config FILE`` or ``SPINF_CONFIG``) > the served model's manifest (engine settings and ``media``) > built-in
default; a higher layer replaces a list. It records where each value came from in ``Settings.origins``
(``flag --port``, ``env SPINF_PORT``, ``config /etc/spinf.toml:12``, ``manifest spinf/gemma-4-12b-fp8``,
``default``). Every value given in any layer is checked, even one a higher layer overrides, and every refusal is a
``ConfigError`` whose one-line message names the dotted setting, where the value came from and what is allowed.

The TOML file has the sections ``[engine]``, ``[server]``, ``[features]`` and ``[limits]``, and the pack keys
(``packs``, ``official_packs``, ``packs_allow_namespace``, ``packs_refresh``, ``packs_official``) may also sit in a
``[packs]`` section. A known key anywhere else (outside any table, or in another table: the reference flattens its
tables) is read as well, with one note naming the section it belongs in; an unknown key refuses the start. Besides the
spec's names, two settings exist only as documented environment names and their TOML keys: ``cache_dirs``
(``SPINF_CACHE_DIRS``, colon-separated) and ``packs_official`` (``SPINF_PACKS_OFFICIAL``).

Extra names (api spec §9.1): ``SPINF_ENGINE_TOKEN`` for ``trusted_token``; the reference's ``SPINF_MEDIA_KINDS`` and
TOML keys ``media_kinds`` and ``load_media`` for ``media``. Within one layer the canonical name wins over an extra
name, and ``media_kinds`` over ``load_media``. ``media`` also takes the reference's booleans: false is none, true
chooses no kinds of its own (`Media.defers`), so ``SPINF_MEDIA=1`` beside ``media_kinds`` leaves those kinds. The
reference's ``model_id`` with no model given (no ``MODEL``, ``SPINF_MODEL`` or ``model`` key) is the model to serve,
resolved like any model name; the manifest it resolves to then sets ``model_id`` as usual.

No setting is accepted and then ignored. A setting whose feature this build does not have yet (none today, see
``_NOT_BUILT``) takes only its default: any other value, in any layer, is refused with ``Setting.not_built`` as the
reason. The reference's engine settings that this engine has no knob for (``Setting.no_effect``) are read and
checked against the reference's type in every layer, and each one given is reported (``Settings.notes``, logged once
at start and printed by ``spinf-serve config``) as having no effect, with the reason.

``Limits`` and ``Features`` are the plain objects the engine and the request parser take; the ``limits`` section of
the tree is a ``Limits`` and ``FeatureSettings.to_features()`` gives the ``Features``.
"""

from __future__ import annotations

import difflib
import logging
import types
from collections.abc import Callable, Iterator, Mapping

from spinf.errors import ConfigError
from spinf.settings.file import ConfigFile, Entry, read_config
from spinf.settings.table import (
    DEFAULT_MODEL,
    MANIFEST_KEYS,
    PACK_KEYS,
    SECTION_CLASSES,
    SECTIONS,
    SETTING,
    SETTINGS,
    TOML_EXTRA,
    EngineSettings,
    Features,
    FeatureSettings,
    Limits,
    ServerSettings,
    Setting,
    Settings,
)

__all__ = [
    "DEFAULT_MODEL",
    "MANIFEST_KEYS",
    "PACK_KEYS",
    "SECTIONS",
    "SETTING",
    "SETTINGS",
    "TOML_EXTRA",
    "EngineSettings",
    "FeatureSettings",
    "Features",
    "Limits",
    "ServerSettings",
    "Setting",
    "Settings",
    "load_settings",
    "log_notes",
]

log = logging.getLogger(__name__)

Given = tuple[object, str]  # (raw value, origin)
Layer = Mapping[str, tuple[Given, ...]]  # setting name -> its values in the layer, the one that wins first


def load_settings(
    flags: Mapping[str, object],
    environ: Mapping[str, str],
    *,
    manifest_defaults: Callable[[str], Mapping[str, object]] | None = None,
) -> Settings:
    """The layered settings. ``flags`` holds only what the user gave (setting name, or ``config``, to the flag's text,
    list or boolean); ``manifest_defaults(model)`` gives the served model's manifest layer once the model is known.

    Raises ``ConfigError`` for any bad value, key, file or combination; ``manifest_defaults`` may raise its own."""
    env = {name: text for name, text in environ.items() if name.startswith("SPINF_") and text != ""}
    config, config_origin = _config_file(flags, env)
    from_file, notes = _file_layer(read_config(config, config_origin)) if config is not None else ({}, [])
    model, model_origin = _pick(SETTING["model"], flags, env, from_file)
    repo, repo_origin = _pick(SETTING["model_id"], flags, env, from_file)
    by_repo = model_origin == "default" and repo_origin != "default" and repo != ""
    if by_repo:  # the reference serves its model_id when no model is named (api spec §9.1, drop-in)
        model, model_origin = repo, repo_origin
    manifest = _manifest_layer(str(model), manifest_defaults)
    values, origins = {}, {"config": config_origin}
    for setting in SETTINGS:
        values[setting.name], origins[setting.name] = _pick(setting, flags, env, from_file, manifest)
    if by_repo:  # model_id named the model; the manifest it resolved to, if any, sets model_id
        values["model"], origins["model"] = model, model_origin
        values["model_id"], origins["model_id"] = _pick(SETTING["model_id"], {}, {}, manifest)
    sections = {
        section: cls(**{s.name: values[s.name] for s in SETTINGS if s.section == section})
        for section, cls in SECTION_CLASSES.items()
    }
    notes += [_no_effect(s, values[s.name], origins[s.name]) for s in SETTINGS if s.no_effect]
    return Settings(
        **sections,
        config=config,
        origins=types.MappingProxyType(origins),
        notes=tuple(note for note in notes if note),
    )


def log_notes(settings: Settings) -> None:
    """Log each of ``settings.notes`` once, as a warning (``spinf-serve serve`` and ``score`` at start)."""
    for note in settings.notes:
        log.warning("%s", note)


def _no_effect(setting: Setting, value: object, origin: str) -> str:
    """The start's line for a reference setting without a knob here, when it was given ("" when not)."""
    if origin == "default":
        return ""
    return f"{setting.key} = {setting.literal(value)} ({origin}): no effect on this engine: {setting.no_effect}"


def _pick(setting: Setting, flags: Mapping[str, object], env: Mapping[str, str], *lower: Layer) -> tuple:
    """The first layer's value and origin, after checking every layer's value for this setting."""
    chosen = None
    for raw, origin, text in _given(setting, flags, env, lower):
        value = setting.parse(raw, origin, text=text)
        if chosen is None and setting.counts(raw, value):
            chosen = (value, origin)
    return chosen or (setting.default, "default")


def _given(setting: Setting, flags: Mapping[str, object], env: Mapping[str, str], lower) -> Iterator[tuple]:
    """Each layer's ``(raw value, origin, is text)`` for ``setting``, highest layer first."""
    if setting.name in flags:
        raw = flags[setting.name]
        yield raw, _flag_origin(setting, raw), isinstance(raw, str)
    for name in setting.env:
        if name in env:
            yield env[name], f"env {name}", True
    for layer in lower:
        for raw, origin in layer.get(setting.name, ()):
            yield raw, origin, False


def _flag_origin(setting: Setting, raw: object) -> str:
    if setting.name == "model":
        return "argument MODEL"
    if len(setting.flags) == 2 and (raw is False or raw == ()):
        return f"flag {setting.flags[1]}"  # the negative of a pair: --no-extraction, --no-media
    return f"flag {setting.flags[0]}"


def _config_file(flags: Mapping[str, object], env: Mapping[str, str]) -> tuple[str | None, str]:
    if "config" in flags:
        return str(flags["config"]), "flag --config"
    if "SPINF_CONFIG" in env:
        return env["SPINF_CONFIG"], "env SPINF_CONFIG"
    return None, "default"


def _manifest_layer(model: str, manifest_defaults: Callable[[str], Mapping[str, object]] | None) -> Layer:
    if manifest_defaults is None:
        return {}
    defaults = dict(manifest_defaults(model))
    origin = f"manifest {defaults.get('served_model') or model}"
    stray = sorted(set(defaults) - MANIFEST_KEYS)
    if stray:
        raise ConfigError(
            f"{origin}: sets {stray[0]!r}, which a manifest cannot set; it sets engine settings and media"
        )
    return {name: ((value, origin),) for name, value in defaults.items()}


def _file_layer(config: ConfigFile) -> tuple[Layer, list[str]]:
    """The file's settings by name, once every key has been checked against the table of settings, and a note for
    each key read outside its own section. Within the file a setting's own key wins over its extra names."""
    found: dict[str, list[tuple[int, object, str]]] = {}
    first_at: dict[str, str] = {}
    notes = []
    for entry in config.entries:
        setting, rank, home = _setting_of(entry)
        dotted = f"{setting.section}.{entry.key}"
        if entry.key in first_at:
            raise ConfigError(f"{dotted} ({entry.origin}): set again (first at {first_at[entry.key]})")
        first_at[entry.key] = entry.origin
        found.setdefault(setting.name, []).append((rank, entry.value, entry.origin))
        if entry.section not in home:
            written = f"{entry.section}.{entry.key}" if entry.section else entry.key
            where = f"[{entry.section}]" if entry.section else "outside any section"
            notes.append(
                f"{written} ({entry.origin}): read as {setting.key}, but it belongs in [{home[0]}], not {where}"
            )
    layer = {name: tuple((raw, origin) for _, raw, origin in sorted(given)) for name, given in found.items()}
    return layer, notes


_SECTIONS_TEXT = "[engine], [server], [features] (or [packs] for the pack keys) and [limits]"


def _setting_of(entry: Entry) -> tuple[Setting, int, tuple[str, ...]]:
    """The setting a file's key sets, its rank among the setting's names (0 for its own) and the sections it sits
    in without a note; ``ConfigError`` for an unknown key."""
    if entry.key in SETTING:
        setting = SETTING[entry.key]
        return setting, 0, (setting.section, "packs") if setting.name in PACK_KEYS else (setting.section,)
    if entry.key in TOML_EXTRA:
        name, home = TOML_EXTRA[entry.key]
        return SETTING[name], 1 + list(TOML_EXTRA).index(entry.key), home
    dotted = f"{entry.section}.{entry.key}" if entry.section else entry.key
    near = difflib.get_close_matches(entry.key, SETTING, n=1)
    hint = f"did you mean {SETTING[near[0]].key}? " if near else ""
    takes = [s.name for s in SETTINGS if entry.section in (s.section, "packs" if s.name in PACK_KEYS else "")]
    where = f"[{entry.section}] takes {', '.join(takes)}" if takes else f"keys go in the sections {_SECTIONS_TEXT}"
    raise ConfigError(f"{dotted} ({entry.origin}): unknown key; {hint}{where}")
