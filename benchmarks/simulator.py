"""Does the cost model predict this machine's step times?

For each program and strategy below (DP, TP, DP+TP, ZeRO-1/2/3 and
combinations, on meshes 8, 4x2, 2x4 and 1x8): measures a step (median of
paired rounds: every round runs every strategy once, in a shuffled order,
inputs pre-sharded), calibrates this machine in the same rounds (each of
`partir.calibrate`'s probes runs among the strategies, so the profile sees
the load the strategies see: on a shared host the load moves the figures by
2x within minutes), predicts each step on that profile (`Lowered.estimate`),
and prints both with Spearman's ρ of the predicted and measured times and
the median |predicted/measured - 1|, and the predicted peak memory beside
XLA's `memory_analysis()` (arguments, outputs and temporaries, per device).

Two columns say where a memory miss comes from, since XLA's allocation is
XLA's to choose: jax.jit's program with the same shardings
(`benchmarks.vs_jit.baseline`), whose XLA total is partir's on most rows
(the allocation belongs to the strategy, not to how partir wrote it); and
the largest all-reduce of the compiled program, which XLA's combiner makes
from the gradient all-reduces and which holds every gradient at once (on
the MLP's data-parallel rows its size is exactly XLA's temporaries; on CPU
a ZeRO reduce-scatter is a sum then a slice, `lowering.to_jax.
_reduce_scatter`, whose full-size sums double it). The cost model's
liveness frees each gradient at its own all-reduce.

CPU caveat (shared/guides/jax.md): the 8 devices share this host's cores, so
a step's time is the total work over the cores; the calibration measures
compute and collectives under that same sharing.

    python -m benchmarks.simulator [--rounds 10] [--small] [--clock cpu]
    python -m benchmarks.simulator --scale 96   # only: simulating the 96-layer step on 16x8 H100s
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import time
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.sharding import NamedSharding

import partir
from benchmarks.hlo_stats import collective_ops
from benchmarks.vs_jit import baseline
from examples import block_train_step, mlp_train_step
from partir.api import devices_for
from partir.cost.calibrate import (
    MIN_SECONDS,
    batched,
    calibration_probes,
    fit_profile,
    workload_for,
)
from partir.report import XlaMemory

MESHES = {
    "8": {"batch": 8},
    "4x2": {"batch": 4, "model": 2},
    "2x4": {"batch": 2, "model": 4},
    "1x8": {"model": 8},
}
DP = partir.BatchParallel("batch")
TP = partir.Megatron("model")
STRATEGIES: list[tuple[str, str, list[partir.Tactic]]] = [
    ("8", "DP", [DP]),
    ("8", "DP+ZeRO-1", [DP, partir.ZeRO("batch", 1)]),
    ("8", "DP+ZeRO-2", [DP, partir.ZeRO("batch", 2)]),
    ("8", "DP+ZeRO-3", [DP, partir.ZeRO("batch", 3)]),
    ("4x2", "DP", [DP]),
    ("4x2", "TP", [TP]),
    ("4x2", "DP+TP", [DP, TP]),
    ("4x2", "DP+TP+ZeRO-1", [DP, TP, partir.ZeRO("batch", 1)]),
    ("4x2", "DP+TP+ZeRO-3", [DP, TP, partir.ZeRO("batch", 3)]),
    ("2x4", "TP", [TP]),
    ("2x4", "DP+TP", [DP, TP]),
    ("2x4", "DP+TP+ZeRO-3", [DP, TP, partir.ZeRO("batch", 3)]),
    ("1x8", "TP", [TP]),
]


def programs(small: bool) -> dict[str, tuple]:
    if small:
        return {
            "MLP": (mlp_train_step.program, mlp_train_step.make_args(batch=64, d_in=64,
                                                                     hidden=256, d_out=64)),
            "block": (block_train_step.program, block_train_step.make_args(
                batch=8, seq=32, width=64, mlp_width=256)),
        }
    return {
        "MLP": (mlp_train_step.program, mlp_train_step.make_args(
            batch=256, d_in=512, hidden=2048, d_out=512)),
        "block": (block_train_step.program, block_train_step.make_args(
            batch=8, seq=128, width=256, mlp_width=1024)),
        "wide block": (block_train_step.program, block_train_step.make_args(
            batch=8, seq=64, width=512, mlp_width=2048)),
    }


def process_seconds() -> float:
    """This process's CPU time (user and system, every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def time_rounds(rows: list[dict], rounds: int, clock: str = "wall") -> None:
    """Paired rounds: warm every row up, then each round runs every row once
    in a shuffled order, appending its seconds to `row["times"]` (`clock`
    "cpu": the process's CPU time, which other work on the host moves less
    than the wall clock)."""
    now = process_seconds if clock == "cpu" else time.perf_counter
    for row in rows:
        jax.block_until_ready(row["run"](*row["inputs"]))
    for _ in range(rounds):
        for row in random.sample(rows, len(rows)):
            t0 = now()
            jax.block_until_ready(row["run"](*row["inputs"]))
            row["times"].append(now() - t0)


def simulate_at_scale(layers: int = 96) -> tuple[partir.Estimate, float]:
    """`partir.simulate` of the `layers`-layer training step at a large model's
    shapes (batch 256, seq 2048, width 4096, MLP 16384), BatchParallel +
    Megatron on a 16x8 H100 profile, from abstract shapes; with its wall
    seconds."""
    from examples import stack_train_step

    sizes = {4: 256, 6: 2048, 10: 4096, 14: 16384}
    args = stack_train_step.make_args(layers_=layers, batch=4, seq=6, width=10, mlp_width=14)
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(tuple(sizes.get(n, n) for n in x.shape), x.dtype), args
    )
    start = time.perf_counter()
    estimate = partir.simulate(
        stack_train_step.program, abstract, {"data": 16, "model": 8},
        [partir.BatchParallel("data"), partir.Megatron("model")],
        partir.named_profile("h100-16x8"),
    )
    return estimate, time.perf_counter() - start


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(x: list[float]) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        values = np.asarray(x)
        for v in set(x):
            tied = values == v
            r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="small shapes, for a quick check")
    parser.add_argument("--profile", help="a saved profile JSON instead of calibrating")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time steps and probes by the wall clock or by this process's CPU "
                        "time (steadier on a host other work shares; predicts cores x wall)")
    parser.add_argument("--scale", type=int, metavar="LAYERS",
                        help="only time simulating the LAYERS-layer step on 16x8 H100s")
    opts = parser.parse_args()
    if opts.scale:
        estimate, seconds = simulate_at_scale(opts.scale)
        print(f"{opts.scale}-layer step on 16x8 H100s: simulated in {seconds:.1f} s; "
              f"predicted step {estimate.seconds * 1e3:.1f} ms, "
              f"peak {estimate.peak_bytes / 2**30:.1f} GiB per device; "
              f"{len(jax.live_arrays())} device arrays live")
        return
    start = time.perf_counter()
    probes: list[dict[str, Any]] = []
    if not opts.profile:  # calibrated in the same rounds as the strategies
        jax_mesh = devices_for(partir.Mesh(MESHES["4x2"]), None)
        platform = jax.devices()[0].platform
        work = workload_for(platform, jax_mesh.size)
        for p in calibration_probes(MESHES["4x2"], platform, work):
            run, per = batched(p.build(jax_mesh))  # each timing >= MIN_SECONDS, as calibrate's
            probes.append({"name": p.label, "probe": p, "run": run, "per": per, "inputs": [],
                           "times": []})
    rows = []
    for prog_name, (program, args) in programs(opts.small).items():
        for mesh_name, strat, tactics in STRATEGIES:
            mesh = partir.Mesh(MESHES[mesh_name])
            try:
                lowered = partir.jit(program, mesh=mesh, tactics=tactics).lower(*args)
            except partir.TacticError as err:  # e.g. ZeRO-1 of a step with no optimizer state
                print(f"skipped {prog_name} {mesh_name} {strat}: {err}")
                continue
            compiled = lowered.compile()
            leaves = jax.tree_util.tree_leaves(args)
            inputs = [
                jax.device_put(x, NamedSharding(compiled.jax_mesh, spec))
                for x, spec in zip(leaves, compiled.program.IN_SPECS, strict=True)
            ]
            xla = compiled.run.lower(*inputs).compile()
            reference, _ = baseline(program, args, compiled)
            jit_xla = reference.lower(*inputs).compile()
            rows.append({
                "name": f"{prog_name} {mesh_name} {strat}",
                "run": compiled.run,
                "inputs": inputs,
                "lowered": lowered,
                "xla": XlaMemory.from_stats(xla.memory_analysis()),
                "jit_bytes": XlaMemory.from_stats(jit_xla.memory_analysis()).total,
                "combined_bytes": max(
                    (c.bytes for c in collective_ops(xla.as_text()) if c.kind == "all-reduce"),
                    default=0,
                ),
                "times": [],
            })
    loads = [os.getloadavg()[0]]
    time_rounds(rows + probes, opts.rounds, opts.clock)
    loads.append(os.getloadavg()[0])
    if opts.profile:
        profile = partir.Profile.load(opts.profile)
    else:
        profile = fit_profile(
            [(p["probe"], statistics.median(p["times"]) / p["per"]) for p in probes],
            mesh=MESHES["4x2"], devices=jax.devices(),
            how=f"median of {opts.rounds} rounds paired with the strategies, each timing "
            f">= {MIN_SECONDS} s ({opts.clock} time)",
        )
    print(f"profile: {profile.device}, {profile.levels}")
    print("\n".join(f"  {source}" for source in profile.sources))
    for row in rows:
        row["predicted"] = row["lowered"].estimate(profile)
    print("| program mesh strategy | predicted ms | measured ms | predicted/measured "
          "| peak MiB predicted | XLA MiB args/outputs/temp | XLA total MiB | mem ratio "
          "| jax.jit XLA total MiB | largest all-reduce MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    predicted_ms, measured_ms = [], []
    for row in rows:
        p = row["predicted"].seconds * 1e3
        m = statistics.median(row["times"]) * 1e3
        predicted_ms.append(p)
        measured_ms.append(m)
        mem = row["predicted"].peak_bytes / 2**20
        parts = row["xla"]
        xla = parts.total / 2**20
        print(f"| {row['name']} | {p:.2f} | {m:.2f} | {p / m:.2f} | {mem:.1f} "
              f"| {parts.arguments / 2**20:.1f}/{parts.outputs / 2**20:.1f}/"
              f"{parts.temporaries / 2**20:.1f} | {xla:.1f} | {mem / xla:.2f} "
              f"| {row['jit_bytes'] / 2**20:.1f} | {row['combined_bytes'] / 2**20:.1f} |")
    errors = [abs(p / m - 1) for p, m in zip(predicted_ms, measured_ms, strict=True)]
    print(f"\n{len(rows)} strategies; Spearman rho (predicted vs measured time): "
          f"{spearman(predicted_ms, measured_ms):.3f}; median |predicted/measured - 1|: "
          f"{statistics.median(errors):.0%} (max {max(errors):.0%}); load average "
          f"{loads[0]:.1f} before the rounds, {loads[1]:.1f} after")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
