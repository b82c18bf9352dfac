"""This machine's profile as `partir.calibrate()` saved it (`machine_profile`),
else the shipped one partir falls back to: the lookup alone, without
measuring (`partir.search` asks for it; `calibrate` measures and saves).

The compiler tools load this module and start without JAX: JAX is imported
on use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from partir.cost.profile import Profile
from partir.generated_files import cache_directory, private_directory


def default_path(label: str) -> Path:
    """Where `calibrate` saves the profile named `label`: partir's private cache."""
    folder = private_directory(cache_directory() / "profiles")
    if folder is None:
        raise OSError(f"cannot make a private profiles directory under {cache_directory()}")
    return folder / _file_name(label)


def default_label(devices: Any) -> str:
    """The name `calibrate` gives this machine's profile ("calibrated-cpu-8")."""
    return f"calibrated-{devices[0].platform}-{len(devices)}"


def _file_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label) + ".json"


SHIPPED_FALLBACK = "cpu-host-8"
"""The shipped profile `machine_profile` falls back to: this project's 2-core
host with 8 virtual CPU devices, measured by `calibrate`."""


def machine_profile() -> tuple[Profile, str]:
    """This machine's profile as `calibrate()` saved it (mesh default, in the
    private cache), and a note saying which profile it is; where none is
    saved, the shipped `SHIPPED_FALLBACK`, and a note saying how to measure
    this machine instead (calibrating takes about a minute, so it is never
    done behind the caller's back)."""
    import jax

    path = cache_directory() / "profiles" / _file_name(default_label(jax.devices()))
    if path.is_file() and not path.is_symlink() and path.stat().st_uid == os.getuid():
        return Profile.load(path), f"this machine's calibrated profile ({path})"
    note = (
        f"no calibrated profile of this machine in {path.parent}; using the shipped "
        f"{SHIPPED_FALLBACK!r} (run partir.calibrate() once, about a minute, to measure "
        "this one)"
    )
    return Profile.load(SHIPPED_FALLBACK), note
