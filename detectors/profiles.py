"""Detector profiles: which calibration fits a run, read from its labels (torch-free).

Thresholds do not carry across architectures or dispatch: the reference implementation of
these monitors says so for MHA vs GQA/MLA, and capacity changes what a router's gradient sees.
So each (architecture, dispatch) pair is calibrated on its own healthy runs, shipped as
``detectors/calibrated/<profile>.json``. A run's profile is ``<arch>`` with dropless dispatch and
``<arch>+<dispatch>`` otherwise; a run without these labels is the lab's own ``gpt-moe``.

>>> profile_of({})
'gpt-moe'
>>> profile_of({"arch": "gpt-moe", "dispatch": "capacity-1"})
'gpt-moe+capacity-1'
>>> profile_of({"arch": "mixtral", "dispatch": "dropless"})
'mixtral'
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from .config import DetectorConfig

__all__ = ["DEFAULT_PROFILE", "ProfileConfigs", "profile_of", "shipped_profiles"]

DEFAULT_PROFILE = "gpt-moe"


def profile_of(labels: dict[str, Any]) -> str:
    if isinstance(labels.get("profile"), str):
        return labels["profile"]
    arch = labels.get("arch") or DEFAULT_PROFILE
    dispatch = labels.get("dispatch") or "dropless"
    return str(arch) if dispatch == "dropless" else f"{arch}+{dispatch}"


@dataclass(frozen=True)
class ProfileConfigs:
    """One calibrated config per profile; a run whose profile has none gets ``default``'s.

    Used wherever a single :class:`DetectorConfig` is (``for_labels``, ``version``): the
    detectors pick a run's config from its ``start`` labels."""

    configs: dict[str, DetectorConfig]
    default: str = DEFAULT_PROFILE

    def __post_init__(self) -> None:
        if self.default not in self.configs:
            raise ValueError(f"no config for the default profile {self.default!r}")

    def for_labels(self, labels: dict[str, Any]) -> DetectorConfig:
        return self.configs.get(profile_of(labels), self.configs[self.default])

    @property
    def version(self) -> str:
        """sha1 over the profiles' names and versions (12 hex digits)."""
        text = ",".join(f"{p}={c.version}" for p, c in sorted(self.configs.items()))
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def shipped_profiles() -> ProfileConfigs:
    """The configs calibrated on the shipped lab runs, one per profile."""
    folder = files("foreshock.detectors").joinpath("calibrated")
    configs = {
        entry.name.removesuffix(".json"): DetectorConfig.load(str(entry))
        for entry in folder.iterdir()
        if entry.name.endswith(".json")
    }
    return ProfileConfigs(configs or {DEFAULT_PROFILE: DetectorConfig()})
