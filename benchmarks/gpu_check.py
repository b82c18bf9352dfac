"""partir on one accelerator: its program against jax.jit's, and the cost model's prediction.

On whatever device JAX sees first (a GPU where there is one; the CPU here),
on the mesh {"batch": 1, "model": 1}: the block training step under
BatchParallel + Megatron and under BatchParallel + ZeRO-3, and the scanned
layer stack under BatchParallel, each in f32 and bf16. Per row: the paired
median step time of partir's program and of `jax.jit` of the same function
(`vs_jit.paired_times`: alternating runs, inputs on the device), their
ratio, the largest |Δ| between their outputs, both HLO censuses, and the
step `partir.calibrate()` predicts (calibrated on this device alone, so
communication costs nothing) against the measured one.

Sizes follow the device: on a GPU the block step is batch 32, sequence 256,
width 1024, MLP 4096 and the stack has 12 layers; on a CPU they are small,
so the whole check runs in a few minutes (`--quick`: smaller still, and a
quick calibration, as tests/test_gpu_check.py runs it).

    python -m benchmarks.gpu_check [--rounds 20] [--quick]

Targets on a GPU: ratio <= 1.02 and |predicted/measured - 1| <= 25% per row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "")  # whatever accelerator is there, else the CPU

import jax
import jax.numpy as jnp
import numpy as np

import partir
from benchmarks.hlo_stats import describe_census, op_census
from benchmarks.vs_jit import baseline, paired_times
from examples import block_train_step, scanned_stack
from partir.cost.calibrate import QUICK

MESH = partir.Mesh({"batch": 1, "model": 1})
DP = partir.BatchParallel("batch")
ROWS = {
    "block step DP+TP": ("block", [DP, partir.Megatron("model")]),
    "block step ZeRO-3": ("block", [DP, partir.ZeRO("batch", 3)]),
    "scanned stack DP": ("scanned", [DP]),
}


def shapes(platform: str, quick: bool) -> dict[str, dict[str, int]]:
    """The programs' sizes on `platform` (see the module docstring)."""
    if platform != "cpu":
        return {
            "block": {"batch": 32, "seq": 256, "width": 1024, "mlp_width": 4096},
            "scanned": {"layers_": 12, "batch": 8, "seq": 256, "width": 1024, "mlp_width": 4096},
        }
    if quick:
        return {
            "block": {"batch": 2, "seq": 8, "width": 16, "mlp_width": 32},
            "scanned": {"layers_": 2, "batch": 2, "seq": 8, "width": 16, "mlp_width": 32},
        }
    return {
        "block": {"batch": 4, "seq": 64, "width": 128, "mlp_width": 512},
        "scanned": {"layers_": 4, "batch": 4, "seq": 64, "width": 128, "mlp_width": 512},
    }


def program_and_args(which: str, sizes: dict[str, int], dtype: Any) -> tuple[Any, Any]:
    """The training step and its arguments, floating leaves in `dtype`."""
    if which == "block":
        program, args = block_train_step.program, block_train_step.make_args(**sizes)
    else:
        program, args = scanned_stack.train_step, scanned_stack.make_args(**sizes)

    def cast(x: Any) -> Any:
        x = np.asarray(x)
        return x.astype(dtype) if np.issubdtype(x.dtype, np.floating) else x

    return program, jax.tree_util.tree_map(cast, args)


@dataclass
class Row:
    name: str
    dtype: str
    partir_ms: float
    jit_ms: float
    max_diff: float
    predicted_ms: float
    partir_census: str
    jit_census: str

    @property
    def ratio(self) -> float:
        return self.partir_ms / self.jit_ms

    @property
    def prediction_error(self) -> float:
        return self.predicted_ms / self.partir_ms - 1


def measure(name: str, dtype: Any, sizes: dict, profile: partir.Profile, rounds: int) -> Row:
    which, tactics = ROWS[name]
    program, args = program_and_args(which, sizes[which], dtype)
    lowered = partir.jit(program, mesh=MESH, tactics=tactics).lower(*args)
    compiled = lowered.compile()
    reference, in_shardings = baseline(program, args, compiled)
    leaves = jax.tree_util.tree_leaves(args)
    inputs = [jax.device_put(x, s) for x, s in zip(leaves, in_shardings, strict=True)]
    ours, theirs = compiled.run(*inputs), reference(*inputs)
    diff = max(
        (
            float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))
            for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs),
                            strict=True)
            if np.size(a)
        ),
        default=0.0,
    )
    t_ours, t_ref = paired_times(compiled.run, reference, inputs, rounds)
    return Row(
        name,
        np.dtype(dtype).name,
        t_ours * 1e3,
        t_ref * 1e3,
        diff,
        lowered.estimate(profile).seconds * 1e3,
        describe_census(op_census(compiled.run.lower(*inputs).compile().as_text())),
        describe_census(op_census(reference.lower(*inputs).compile().as_text())),
    )


def run(rounds: int, quick: bool) -> tuple[str, partir.Profile, list[Row]]:
    """The device's name, its calibrated profile, and every row measured."""
    device = jax.devices()[0]
    start = time.perf_counter()
    profile = partir.calibrate(
        {"batch": 1}, save=False, progress=None, workload=QUICK if quick else None,
        repeats=2 if quick else 5,
    )
    seconds = time.perf_counter() - start
    print(f"device: {device.platform} {device.device_kind}; calibrated in {seconds:.0f} s:")
    for line in profile.sources:
        print(f"  {line}")
    sizes = shapes(device.platform, quick)
    rows = [
        measure(name, dtype, sizes, profile, rounds)
        for dtype in (jnp.float32, jnp.bfloat16)
        for name in ROWS
    ]
    return f"{device.platform} {device.device_kind}", profile, rows


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| program | dtype | partir ms | jax.jit ms | ratio | max abs diff | predicted ms "
        "| predicted/measured | partir HLO census | jax.jit HLO census |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.dtype} | {r.partir_ms:.3f} | {r.jit_ms:.3f} | {r.ratio:.3f} "
            f"| {r.max_diff:.2g} | {r.predicted_ms:.3f} | {r.predicted_ms / r.partir_ms:.2f} "
            f"| {r.partir_census} | {r.jit_census} |"
        )
    return lines


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a quick calibration")
    opts = parser.parse_args(argv)
    device, _, rows = run(opts.rounds, opts.quick)
    print(f"\non {device}, mesh {dict(MESH)}:")
    print("\n".join(table(rows)))
    ratios = [r.ratio for r in rows]
    errors = [abs(r.prediction_error) for r in rows]
    print(
        f"\nratio partir/jax.jit: median {statistics.median(ratios):.3f}, max {max(ratios):.3f}; "
        f"|predicted/measured - 1|: median {statistics.median(errors):.0%}, "
        f"max {max(errors):.0%}"
    )
    return rows


if __name__ == "__main__":
    main()
