"""Detector profiles: which calibration fits a run — chosen by its architecture, never defaulted.

Thresholds and bands do not carry across architectures, sizes or dispatch: the reference
implementation of these monitors says so for MHA vs GQA/MLA, capacity changes what a router's
gradient sees, and the lab's Mixtral at hidden 192 left the bands of the 128-wide one on 8 of 9
healthy runs. So each calibrated profile (``detectors/calibrated/<profile>.json``) applies
only to runs whose architecture signature (:mod:`foreshock.detectors.signatures`) it was
calibrated on (``detectors/calibrated/signatures.json``); every other run gets the
**zero-shot** profile: run-relative rules whose thresholds were calibrated across the lab's
architectures (:mod:`foreshock.detectors.zero_shot`). A run may name its profile (label
``profile``, or ``arch`` and ``dispatch``: ``<arch>`` with dropless dispatch and
``<arch>+<dispatch>`` otherwise); the name is honoured unless the run's signature says it is
another model. Every choice says why (``ProfileChoice.reason``), and the detectors report it.
A store whose ``foreshock tune`` published a live config judges by it every run that no
profile published into the store fits (:func:`with_live`): the live config takes the
zero-shot profile's place, named ``live``.

**A profile knows its recipe.** Bands and thresholds calibrated at one learning-rate schedule
do not hold at another (``docs/recipes.md``), so a profile records the recipes of its
calibration runs (``recipes.json``: {name: [recipe, ...]}, :mod:`foreshock.recipe`). A run
whose declared recipe (label ``recipe``) is none of them is judged by the fallback's rules,
which hold across recipes, and told why; a run that declares none is checked record by
record against its learning rates (:mod:`~foreshock.detectors.schedule_clock`).

>>> profile_of({"arch": "gpt-moe", "dispatch": "capacity-1"})
'gpt-moe+capacity-1'
>>> profile_of({"arch": "mixtral", "dispatch": "dropless"})
'mixtral'
>>> profile_of({})
'gpt-moe'
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, NamedTuple

from foreshock.recipe import Recipe, recipe_mismatch

from .config import DetectorConfig
from .signatures import describe, same_model, signature_of

__all__ = [
    "ZERO_SHOT",
    "ProfileChoice",
    "ProfileConfigs",
    "choose_profile",
    "load_profiles",
    "merged",
    "profile_of",
    "save_profile",
    "shipped_profiles",
    "with_live",
]

ZERO_SHOT = "zero-shot"
LIVE = "live"  # a store's tuned config, where ``foreshock tune`` published one
LAB_PROFILE = "gpt-moe"  # the lab's own model
SIGNATURES_FILE = "signatures.json"  # profile -> the signatures it was calibrated on
RECIPES_FILE = "recipes.json"  # profile -> the recipes of its calibration runs


def profile_of(labels: dict[str, Any]) -> str:
    """The profile a lab run's labels name: the lab's own ``gpt-moe`` when they name none
    (its first recorded runs carry no ``arch``). ``choose`` reads labels with ``_asked``."""
    return _asked(labels) or LAB_PROFILE


def _asked(labels: dict[str, Any]) -> str | None:
    """The profile a run's labels name, if any: a run that names none asks for none."""
    if isinstance(labels.get("profile"), str):
        return labels["profile"]
    if not labels.get("arch"):
        return None
    arch, dispatch = str(labels["arch"]), labels.get("dispatch") or "dropless"
    return arch if dispatch == "dropless" else f"{arch}+{dispatch}"


class ProfileChoice(NamedTuple):
    """The profile a run is judged by, its config, and why it was chosen."""

    name: str
    config: DetectorConfig
    reason: str
    recipes: tuple[Recipe, ...] = ()  # the recipes it was calibrated on (none: no claim)


@dataclass(frozen=True)
class ProfileConfigs:
    """One config per profile, and the architecture signatures each was calibrated on.

    Used wherever a single :class:`DetectorConfig` is (``choose``, ``version``): the
    detectors pick a run's config from its ``start`` record."""

    configs: dict[str, DetectorConfig]
    signatures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fallback: str = ZERO_SHOT  # the profile of a run no signature fits
    recipes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def choose(self, start: dict[str, Any] | None) -> ProfileChoice:
        """The profile for a run with this ``start`` record (see the module docstring)."""
        start = start or {}
        signature = signature_of(start)
        asked = _asked(start.get("labels") or {})
        notes = []
        chosen = None
        if asked is not None and asked in self.configs:
            made_for = self.signatures.get(asked, [])
            if signature is None or not made_for or any(same_model(signature, s) for s in made_for):
                chosen = (asked, f"the run's labels name {asked}")
            else:
                notes.append(
                    f"labels name {asked}, calibrated on {_models(made_for)}, not this model"
                )
        elif asked is not None:
            notes.append(f"labels name {asked}, which no config here has")
        for name in reversed(list(self.signatures)):  # the last merged (a user's) first
            if (
                chosen is None
                and name in self.configs
                and any(same_model(signature, s) for s in self.signatures[name])
            ):
                chosen = (name, f"calibrated on {describe(signature)}")
        if chosen is not None:
            recipes = self.recipes_of(chosen[0])
            declared = Recipe.from_labels((start.get("labels") or {}).get("recipe"))
            outside = None if declared is None else recipe_mismatch(declared, list(recipes))
            if outside is None:
                return ProfileChoice(chosen[0], self.configs[chosen[0]], chosen[1], recipes)
            notes.append(f"{chosen[0]} fits the model, but {outside}")
        elif signature is None:
            notes.append("the run sent no architecture signature")
        else:
            notes.append(f"no profile was calibrated on {describe(signature)}")
        return self.fallback_choice("; ".join(notes))

    def recipes_of(self, name: str) -> tuple[Recipe, ...]:
        """The recipes profile ``name`` was calibrated on (unreadable entries skipped)."""
        found = (Recipe.from_labels(r) for r in self.recipes.get(name, []))
        return tuple(r for r in found if r is not None)

    def fallback_choice(self, why: str) -> ProfileChoice:
        """The profile of a run no calibrated one fits, saying ``why``."""
        name = self.fallback
        if name in self.configs:
            rules = "zero-shot rules" if name == ZERO_SHOT else f"the {name} config"
            return ProfileChoice(name, self.configs[name], f"{why}: {rules}")
        return ProfileChoice(name, DetectorConfig(), f"{why}; no {name} config: no rule")

    @property
    def version(self) -> str:
        """sha1 over the profiles' names and versions (12 hex digits)."""
        text = ",".join(f"{p}={c.version}" for p, c in sorted(self.configs.items()))
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def choose_profile(
    configs: DetectorConfig | ProfileConfigs, start: dict[str, Any] | None
) -> ProfileChoice:
    """``configs.choose(start)``; one config given (``--config``) judges every run."""
    if isinstance(configs, DetectorConfig):
        return ProfileChoice("given", configs, "one config was given for every run")
    return configs.choose(start)


def _models(signatures: list[dict[str, Any]]) -> str:
    return ", ".join(describe(s) for s in signatures)


def shipped_profiles() -> ProfileConfigs:
    """The configs calibrated on the shipped lab runs, one per profile, with their signatures."""
    return load_profiles(files("foreshock.detectors").joinpath("calibrated"))


def load_profiles(folder: Any) -> ProfileConfigs:
    """The profiles in a folder: ``<name>.json`` (a :class:`DetectorConfig`) each, and
    ``signatures.json`` ({name: [signature, ...]}). The shipped profiles and the ones a user
    makes (``save_profile``) share this layout. ``folder``: a path, an importlib resource, or
    a store's :class:`~foreshock.storage.store_files.StoreFiles` (local or object storage)."""
    names, read = _reader(Path(folder) if isinstance(folder, str) else folder)
    texts = {name: read(name) for name in names if name.endswith(".json")}
    configs = {
        name.removesuffix(".json"): DetectorConfig.from_dict(_without_version(text))
        for name, text in texts.items()
        if name not in (SIGNATURES_FILE, RECIPES_FILE)
    }
    signatures = json.loads(texts[SIGNATURES_FILE]) if SIGNATURES_FILE in texts else {}
    recipes = json.loads(texts[RECIPES_FILE]) if RECIPES_FILE in texts else {}
    return ProfileConfigs(configs, signatures, recipes=recipes)


def _reader(folder: Any) -> tuple[list[str], Any]:
    """(file names, name → text) of a path, an importlib resource or store files."""
    if hasattr(folder, "read_text") and hasattr(folder, "names"):  # StoreFiles
        return folder.names(), folder.read_text
    if not folder.is_dir():
        return [], None
    names = [entry.name for entry in folder.iterdir() if entry.is_file()]
    return names, lambda name: folder.joinpath(name).read_text()


def _without_version(text: str) -> dict[str, Any]:
    data = json.loads(text)
    data.pop("version", None)
    return data


def save_profile(
    folder: str | Path | Any,
    name: str,
    config: DetectorConfig,
    signatures: list[dict[str, Any]],
    recipes: list[dict[str, Any]] | None = None,
) -> str:
    """Write a named profile into ``folder`` (``load_profiles``' layout: a path or a store's
    :class:`~foreshock.storage.store_files.StoreFiles`); returns where its file is.
    A name the shipped profiles use is refused: a user's profile sits beside them.
    ``recipes``: those of its calibration runs (None or empty: it claims none)."""
    if not name or "/" in name or name.startswith(".") or name == SIGNATURES_FILE[:-5]:
        raise ValueError(f"not a profile name: {name!r}")
    if name in shipped_profiles().configs:
        raise ValueError(f"{name!r} is a shipped profile; choose another name")
    from foreshock.storage.store_files import StoreFiles

    files = folder if isinstance(folder, StoreFiles) else StoreFiles(Path(folder).absolute(), "")
    data = {**config.to_dict(), "version": config.version}
    with files.lock():
        files.write_text(f"{name}.json", json.dumps(data, indent=1))
        known = json.loads(files.read_text(SIGNATURES_FILE) or "{}")
        files.write_text(SIGNATURES_FILE, json.dumps({**known, name: signatures}, indent=1) + "\n")
        known = json.loads(files.read_text(RECIPES_FILE) or "{}")
        known = {k: v for k, v in known.items() if k != name} | ({name: recipes} if recipes else {})
        files.write_text(RECIPES_FILE, json.dumps(known, indent=1) + "\n")
    return f"{files}/{name}.json"


def with_live(live: DetectorConfig, published: ProfileConfigs) -> ProfileConfigs:
    """A store's live config (``foreshock tune``) for every run, but those a profile published
    into the store fits: a user's profile of one model is more specific than a fleet's tune.

    >>> live = DetectorConfig(confirm=3)
    >>> with_live(live, ProfileConfigs({})).choose({}).name
    'live'
    """
    return ProfileConfigs(
        {**published.configs, LIVE: live}, published.signatures, LIVE, published.recipes
    )


def merged(*parts: ProfileConfigs) -> ProfileConfigs:
    """Profiles from several folders as one; a later part's profile of a name wins."""
    configs: dict[str, DetectorConfig] = {}
    signatures: dict[str, list[dict[str, Any]]] = {}
    recipes: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        configs |= part.configs
        signatures |= part.signatures
        recipes = {k: v for k, v in recipes.items() if k not in part.configs} | part.recipes
    return ProfileConfigs(configs, signatures, recipes=recipes)
