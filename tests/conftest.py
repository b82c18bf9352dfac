"""Test setup: an 8-device CPU mesh, set before JAX is imported anywhere.

XLA also compiles without LLVM's optimizations and without its new fusion
emitters: the tests compile hundreds of small programs once each and run
them once, so compiling dominates (about 5x faster this way; partir's
programs and `jax.jit`'s, which they are compared with, under the same
flags). A flag already in `XLA_FLAGS` is left as given.
"""

import os
import sys

FAST_COMPILE = {
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
}

flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
for flag, value in FAST_COMPILE.items():
    if flag not in flags:
        flags += f" {flag}={value}"
os.environ["XLA_FLAGS"] = flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # the examples/ package lives at the repository root
