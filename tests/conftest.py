"""Test setup: an 8-device CPU mesh, set before JAX is imported anywhere.

XLA also compiles with LLVM's -O0 and without its new fusion emitters: the
tests compile hundreds of small programs once each and run them once, so
compiling dominates (the scanned step's compile: 0.9 CPU-s instead of 5.4
by default, 2.5 at -O1; the whole suite 2.3x faster than at -O1; partir's
programs and `jax.jit`'s, which they are compared with, under the same
flags). The llama step of tests/test_partial_sums.py compiles at -O1 for
its numbers (-O0's rounding of its reordered partial sums moves one element
past the tolerance). A flag already in `XLA_FLAGS` is left as given, and the
flags are left out where this jaxlib does not know them (XLA aborts on an
unknown flag).
"""

import os
import subprocess
import sys

import pytest

FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def known_to_xla(flags: list[str]) -> bool:
    """Whether a JAX process starts with these flags (checked in a child process)."""
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
fast = [f for f in FAST_COMPILE if f.split("=")[0] not in flags]
if fast and known_to_xla(fast):
    flags += " " + " ".join(fast)
os.environ["XLA_FLAGS"] = flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # the examples/ package lives at the repository root


@pytest.fixture
def rewrite_engine_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time `partition` hands a program to
    the rewrite engine (`partir.partition._rewrite`), which still runs."""
    partition_module = sys.modules["partir.partition"]  # `partir.partition` is the function
    runs: list[int] = []
    original = partition_module._rewrite
    monkeypatch.setattr(
        partition_module, "_rewrite", lambda *a, **k: runs.append(1) or original(*a, **k)
    )
    return runs
