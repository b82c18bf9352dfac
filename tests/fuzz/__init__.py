"""Differential fuzzing: random JAX programs under random tactics, partir against `jax.jit`.

`grammar` draws the cases, `oracle` runs and classifies one, `profile` runs
many and summarises them; `python -m tests.fuzz --cases N --seed S` is the
long profile, `tests/test_fuzz.py` the seeded CI profile.
"""

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Before JAX is imported: replayed cases and the long profile need 8 CPU devices.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
