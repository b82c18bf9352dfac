"""Propagation speed on the N-layer training step under BatchParallel + Megatron.

Goal (issue 3): at least 10,000 ops/s and linear in N. "ops" counts the
imported program's ops (the work propagation is given); the time covers
planning, the tiling actions and propagation to a fixpoint, not the import.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from examples import stack_train_step
from partir import BatchParallel, Megatron, Mesh, import_jax, partition

LAYERS = (1, 6, 12, 24)
MESH = Mesh({"batch": 4, "model": 2})


def measure(layers: int, repeats: int = 3) -> dict[str, float]:
    args = stack_train_step.make_args(layers_=layers)
    best = float("inf")
    ops = 0
    for _ in range(repeats):
        module = import_jax(stack_train_step.program, *args)
        ops = sum(1 for _ in module.walk())
        start = time.perf_counter()
        partition(module, MESH, [BatchParallel("batch"), Megatron("model")])
        best = min(best, time.perf_counter() - start)
    return {"layers": layers, "ops": ops, "seconds": best, "ops_per_s": ops / best}


def main() -> None:
    rows = [measure(n) for n in LAYERS]
    print("| layers | ops | propagation s | ops/s | µs/op |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layers']} | {r['ops']} | {r['seconds']:.3f} | {r['ops_per_s']:,.0f} "
            f"| {r['seconds'] / r['ops'] * 1e6:.0f} |"
        )


if __name__ == "__main__":
    main()
