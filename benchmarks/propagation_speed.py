"""Propagation speed on the N-layer training step under BatchParallel + Megatron.

Goal (issue 3): at least 10,000 ops/s and linear in N. "ops" counts the
imported program's ops (the work propagation is given); the time covers
planning, the tiling actions and propagation to a fixpoint, not the import.
"propagation" is the rewrite engine (`engine="rewrite"`, the reference).

Beside it (issue 33), the same decisions made in plain data
(`rewrites.factor_propagation` through `partir.partition.decide_partition`):
"decide" is planning, reading the graph and the fixpoint; "fixpoint" the
worklist alone. "decided" is `partition(...)`, the
default path (planning, deciding and building the core IR once,
`rewrites.build_core`), "build" the building alone. Each is the best of
`repeats` runs on a fresh import. The engine's and the decision's CPU
seconds (`time.process_time`) are printed too: on a shared machine they move
less than the wall-clock ones.

    python -m benchmarks.propagation_speed [--layers 1 6 12 24] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from examples import stack_train_step
from partir import BatchParallel, Megatron, Mesh, import_jax, partition

LAYERS = (1, 6, 12, 24)
MESH = Mesh({"batch": 4, "model": 2})


def tactics() -> list:
    return [BatchParallel("batch"), Megatron("model")]


def measure(layers: int, repeats: int = 3) -> dict[str, float]:
    from dialects.heap import paused_gc
    from partir.partition import decide_partition
    from rewrites import build_core, factor_propagation

    args = stack_train_step.make_args(layers_=layers)
    best = best_decide = best_fixpoint = cpu = cpu_decide = cpu_fixpoint = float("inf")
    best_decided = cpu_decided = best_build = cpu_build = float("inf")
    ops = 0
    for _ in range(repeats):
        module = import_jax(stack_train_step.program, *args)
        ops = sum(1 for _ in module.walk())
        start, start_cpu = time.perf_counter(), time.process_time()
        partition(module, MESH, tactics(), engine="rewrite")
        best = min(best, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    for _ in range(repeats):
        module = import_jax(stack_train_step.program, *args)
        with paused_gc():
            start, start_cpu = time.perf_counter(), time.process_time()
            decide_partition(module, MESH, tactics())
            best_decide = min(best_decide, time.perf_counter() - start)
            cpu_decide = min(cpu_decide, time.process_time() - start_cpu)
        wall, cpu_time = factor_propagation.LAST_FIXPOINT_SECONDS
        best_fixpoint, cpu_fixpoint = min(best_fixpoint, wall), min(cpu_fixpoint, cpu_time)
    for _ in range(repeats):
        module = import_jax(stack_train_step.program, *args)
        start, start_cpu = time.perf_counter(), time.process_time()
        partition(module, MESH, tactics(), engine="decided")
        best_decided = min(best_decided, time.perf_counter() - start)
        cpu_decided = min(cpu_decided, time.process_time() - start_cpu)
        wall, cpu_time = build_core.LAST_BUILD_SECONDS
        best_build, cpu_build = min(best_build, wall), min(cpu_build, cpu_time)
    return {
        "layers": layers,
        "ops": ops,
        "seconds": best,
        "ops_per_s": ops / best,
        "decide": best_decide,
        "fixpoint": best_fixpoint,
        "cpu": cpu,
        "cpu_decide": cpu_decide,
        "cpu_fixpoint": cpu_fixpoint,
        "decided": best_decided,
        "cpu_decided": cpu_decided,
        "build": best_build,
        "cpu_build": cpu_build,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="*", default=LAYERS)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    print(
        "| layers | ops | propagation s | ops/s | µs/op (CPU) "
        "| decide µs/op (CPU) | fixpoint µs/op (CPU) "
        "| decided µs/op (CPU) | build µs/op (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in options.layers:
        r = measure(n, options.repeats)
        per_op = 1e6 / r["ops"]
        print(
            f"| {r['layers']} | {r['ops']} | {r['seconds']:.3f} | {r['ops_per_s']:,.0f} "
            f"| {r['seconds'] * per_op:.0f} ({r['cpu'] * per_op:.0f}) "
            f"| {r['decide'] * per_op:.1f} ({r['cpu_decide'] * per_op:.1f}) "
            f"| {r['fixpoint'] * per_op:.1f} ({r['cpu_fixpoint'] * per_op:.1f}) "
            f"| {r['decided'] * per_op:.1f} ({r['cpu_decided'] * per_op:.1f}) "
            f"| {r['build'] * per_op:.1f} ({r['cpu_build'] * per_op:.1f}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
