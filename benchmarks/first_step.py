"""Time to first step: what a user waits for before the step's first result.

The N-layer `examples.stack_train_step` under BatchParallel("batch") +
Megatron("model") on the 4x2 mesh (8 CPU devices). Per N, two fresh
processes, so neither inherits the other's caches or heap:

- partir: `partir.jit(program, mesh=..., tactics=...)(*args)`, the first
  call end to end (lower: import, partition, to_spmd, emit, load; XLA's
  compile of the emitted program; the first run, until its results are ready);
- jax.jit: `jax.jit(flat, in_shardings=<partir's input shardings>)(*leaves)`
  on the same step (lower, compile, first run), the shardings read from the
  partir process's emitted program.

The arguments are made before the clock starts, and imports are not timed.

    python -m benchmarks.first_step [--layers 6 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

LAYERS = (6, 24)


def _mesh() -> Any:
    from partir import Mesh

    return Mesh({"batch": 4, "model": 2})


def _specs_json(in_specs: Any) -> list[list[Any]]:
    return [[list(e) if isinstance(e, tuple) else e for e in spec] for spec in in_specs]


def partir_first_step(layers: int) -> dict[str, Any]:
    """Seconds of partir.jit's first call in this process, and its input specs."""
    import jax

    from examples import stack_train_step
    from partir import BatchParallel, Megatron, jit

    args = stack_train_step.make_args(layers_=layers)
    step = jit(
        stack_train_step.program, mesh=_mesh(), tactics=[BatchParallel("batch"), Megatron("model")]
    )
    start = time.perf_counter()
    jax.block_until_ready(step(*args))
    seconds = time.perf_counter() - start
    (compiled,) = step._compiled.values()  # the one signature just compiled
    return {"seconds": seconds, "in_specs": _specs_json(compiled.program.IN_SPECS)}


def jit_first_step(layers: int, in_specs: list[list[Any]]) -> dict[str, Any]:
    """Seconds of `jax.jit`'s first call with partir's input shardings, in this process."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from examples import stack_train_step
    from partir.api import devices_for

    args = stack_train_step.make_args(layers_=layers)
    leaves, in_tree = jax.tree_util.tree_flatten(args)

    def flat(*flat_args: Any) -> Any:
        return stack_train_step.program(*jax.tree_util.tree_unflatten(in_tree, flat_args))

    jax_mesh = devices_for(_mesh(), None)
    shardings = tuple(
        NamedSharding(jax_mesh, PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in s)))
        for s in in_specs
    )
    start = time.perf_counter()
    jax.block_until_ready(jax.jit(flat, in_shardings=shardings)(*leaves))
    return {"seconds": time.perf_counter() - start}


def run_module(module: str, *options: str, env: dict[str, str] | None = None) -> Any:
    """`python -m module options` in a fresh process; its last stdout line as JSON."""
    out = subprocess.run(
        [sys.executable, "-m", module, *options],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(layers: int, rounds: int = 3) -> dict[str, Any]:
    """One N's row: `rounds` pairs of fresh processes, partir's first step and
    jax.jit's, the pair's order swapping each round (XLA's compile of one
    program moves ±15% between processes: one pair says little); the
    medians, and each round's ratio."""
    partir_times: list[float] = []
    jit_times: list[float] = []
    ratios: list[float] = []
    specs = ""  # partir's input shardings: the first round runs partir first

    def run_partir() -> float:
        nonlocal specs
        row = run_module("benchmarks.first_step", "--partir", str(layers))
        specs = json.dumps(row["in_specs"])
        partir_times.append(row["seconds"])
        return row["seconds"]

    def run_jit() -> float:
        row = run_module("benchmarks.first_step", "--jit", str(layers), specs)
        jit_times.append(row["seconds"])
        return row["seconds"]

    for k in range(rounds):
        if k % 2 == 0:
            mine = run_partir()
            theirs = run_jit()
        else:
            theirs = run_jit()
            mine = run_partir()
        ratios.append(mine / theirs)
    return {
        "layers": layers,
        "partir": statistics.median(partir_times),
        "jax_jit": statistics.median(jit_times),
        "ratios": ratios,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| layers | partir.jit first step s | jax.jit first step s | ratio of medians "
        "| each round's ratio |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        each = ", ".join(f"{r:.2f}" for r in row["ratios"])
        lines.append(
            f"| {row['layers']} | {row['partir']:.1f} | {row['jax_jit']:.1f}"
            f" | {row['partir'] / row['jax_jit']:.2f}x | {each} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    parser.add_argument("--rounds", type=int, default=3, help="pairs of processes per N")
    parser.add_argument("--partir", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--jit", nargs=2, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.partir is not None:
        print(json.dumps(partir_first_step(options.partir)))
        return
    if options.jit is not None:
        layers, specs = options.jit
        print(json.dumps(jit_first_step(int(layers), json.loads(specs))))
        return
    print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    rows = []
    for layers in options.layers:
        rows.append(measure(layers, options.rounds))
        print(f"  {layers} layers done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print(
        "time to first step: lower + compile + first run, fresh process each; "
        f"medians of {options.rounds} pairs"
    )
    print(table(rows))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
