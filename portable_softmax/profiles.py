"""Recorded property sets of real chips (``profiles/*.json``), for planning without the chip.

Each file holds what ``triton.runtime.driver.active.utils.get_device_properties`` returned on the
chip (its raw, vendor-specific key set) and the Triton target; the record is built by the same
backend ``normalize`` that serves a live device, so the device layer is tested on real key sets.
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from portable_softmax.backend import get_backend
from portable_softmax.device import COMPLETED_PROPERTIES
from portable_softmax.record import DeviceRecord


@functools.lru_cache(maxsize=None)
def _profiles() -> dict[str, dict[str, Any]]:
    found = {}
    for entry in resources.files("portable_softmax").joinpath("profiles").iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            found[data["name"]] = data
    return found


def profile_names() -> list[str]:
    return sorted(_profiles())


def load_profile(name: str) -> dict[str, Any]:
    """The raw profile: name, description, target, properties."""
    profiles = _profiles()
    if name not in profiles:
        raise ValueError(f"unknown device profile {name!r}; recorded profiles: {', '.join(sorted(profiles))}")
    return profiles[name]


def recorded_properties(profile: dict[str, Any]) -> dict[str, Any]:
    """A recorded chip's raw properties as a live device's record is built from them: the
    driver's, with what ``device`` asks for beside them (the L2 size) from the facts measured on
    the chip."""
    facts = profile.get("facts", {})
    return {**{key: facts[key] for key in COMPLETED_PROPERTIES if key in facts}, **profile["properties"]}


def profile_record(name: str) -> DeviceRecord:
    """The normalized record of a recorded chip."""
    profile = load_profile(name)
    target = profile["target"]
    # Named as the live device is (tuning rows may be keyed by that name), where the profile says.
    name = profile.get("device_name", profile["description"])
    return get_backend(target["backend"]).normalize(recorded_properties(profile), target["arch"], name)
