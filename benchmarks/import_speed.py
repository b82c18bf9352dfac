"""Import + verify + print speed of the N-layer transformer stack, in ops/s.

Goal (issue 2): at least 5,000 ops/s end to end and linear in N. JAX's own
lowering is included in "import" (it is part of what a user waits for) and
also reported on its own.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax

from dialects.context import make_context
from examples import transformer_stack
from partir.importer import import_jax
from partir.mlir_bridge import MlirToXdsl

LAYERS = (1, 6, 12, 24)


def best_of(repeats: int, fn):
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def cold():
    """A new function object, so no JAX cache serves it."""
    return lambda params, x: transformer_stack.program(params, x)


def measure(layers: int) -> dict[str, float]:
    args = transformer_stack.make_args(layers_=layers)
    # A fresh function object each time, so JAX traces and lowers from scratch.
    lower_s, lowered = best_of(
        3, lambda: jax.jit(cold(), keep_unused=True).lower(*args).compiler_ir("stablehlo")
    )
    convert_s, _ = best_of(3, lambda: MlirToXdsl(make_context()).convert_module(lowered))
    import_s, module = best_of(3, lambda: import_jax(cold(), *args))
    verify_s, _ = best_of(3, module.verify)
    print_s, _ = best_of(3, lambda: str(module))
    ops = sum(1 for _ in module.walk())
    total = import_s + verify_s + print_s
    return {
        "layers": layers,
        "ops": ops,
        "jax_lower_s": lower_s,
        "convert_s": convert_s,
        "import_s": import_s,
        "verify_s": verify_s,
        "print_s": print_s,
        "total_s": total,
        "ops_per_s": ops / total,
    }


def main() -> None:
    rows = [measure(n) for n in LAYERS]
    print(
        "| layers | ops | JAX lowering s | MLIR->xDSL s | import s | verify s | print s "
        "| total s | ops/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layers']} | {r['ops']} | {r['jax_lower_s']:.3f} | {r['convert_s']:.3f} "
            f"| {r['import_s']:.3f} | {r['verify_s']:.3f} | {r['print_s']:.3f} "
            f"| {r['total_s']:.3f} | {r['ops_per_s']:,.0f} |"
        )
    per_op = [r["total_s"] / r["ops"] * 1e6 for r in rows]
    print(f"\nµs per op: {', '.join(f'{p:.0f}' for p in per_op)} (flat = linear in program size)")


if __name__ == "__main__":
    main()
