"""The flagship demo: a transformer training step, partitioned over a 4x2 mesh.

Example (d) — a GPT-2 block's `value_and_grad` + Adam step — runs under
`partir.jit` with BatchParallel("batch") then Megatron("model") on 8 CPU
devices. The demo prints what propagation did, where the emitted `shard_map`
program is, the collectives it performs, and checks every output against plain
`jax.jit` of the same function.
"""

from __future__ import annotations

import collections
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

import partir
from dialects.context import make_context
from dialects.parser import PartirParser
from dialects.partir import LoopOp, SumAttr
from examples import block_train_step


def loop_summary(stage_text: str) -> str:
    module = PartirParser(make_context(), stage_text).parse_module()
    counts = collections.Counter(
        (op.axis_name, "sum" if isinstance(op.action, SumAttr) else "tile")
        for op in module.walk()
        if isinstance(op, LoopOp)
    )
    return ", ".join(
        f'{n} {kind} loops over "{axis}"' for (axis, kind), n in sorted(counts.items())
    )


def main() -> int:
    mesh = partir.Mesh({"batch": 4, "model": 2})
    tactics = [partir.BatchParallel("batch"), partir.Megatron("model")]
    step = partir.jit(block_train_step.program, mesh=mesh, tactics=tactics)
    args = block_train_step.make_args()

    start = time.perf_counter()
    lowered = step.lower(*args)
    lower_s = time.perf_counter() - start
    print(f"partitioned the block training step over {mesh.axes} in {lower_s:.2f}s\n")
    print("propagation:")
    for stage in lowered.stages[1:-1]:
        print(f"  after {stage.name:14s} {loop_summary(stage.text)}")
    print(f"  conflicts: {len(lowered.conflicts)}")
    for conflict in lowered.conflicts:
        print(f"    {conflict}")

    print(f"\nemitted shard_map program: {lowered.source_path}")

    print("\ncollectives (per device):")
    print(f"  {'kind':15s} {'axes':10s} {'count':>5s} {'bytes':>9s}  local shape")
    grouped: dict[tuple[str, tuple[str, ...], str], list[int]] = collections.defaultdict(list)
    for c in lowered.collectives:
        grouped[(c.kind, c.axes, c.operand)].append(c.bytes_per_device)
    for (kind, axes, shape), sizes in sorted(grouped.items()):
        print(f"  {kind:15s} {','.join(axes):10s} {len(sizes):5d} {sum(sizes):9d}  {shape}")
    total = sum(c.bytes_per_device for c in lowered.collectives)
    print(f"  total: {len(lowered.collectives)} collectives, {total} bytes per device")

    compiled = lowered.compile()
    got = jax.tree_util.tree_leaves(compiled(*args))
    ref = jax.tree_util.tree_leaves(jax.jit(block_train_step.program)(*args))
    worst, bad = 0.0, 0
    for g, r in zip(got, ref, strict=True):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        scale = float(np.abs(r).max()) or 1.0
        err = float(np.abs(g - r).max()) / scale
        worst = max(worst, err)
        bad += err > 1e-5
    print(
        f"\n{len(ref)} outputs on {len(jax.devices())} devices; worst error {worst:.1e} of max|ref|"
    )
    if bad:
        print(f"MISMATCH: {bad} outputs differ from jax.jit")
        return 1
    print("partir.jit matches jax.jit on every output")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
