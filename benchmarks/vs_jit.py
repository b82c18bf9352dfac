"""partir's compiled program against `jax.jit` with the same shardings, in one run.

For the MLP and transformer-block training steps under DP, TP, DP+TP and
ZeRO-3, a 4-layer `lax.scan` transformer step under DP, DP+TP and layered
ZeRO-3, and a ResNet-style CNN step under DP, DP + channels, DP + every
conv's output channels and DP + rows (spatial), on the 4x2 CPU mesh: partir's
`shard_map` program, and `jax.jit(fn, in_shardings=..., out_shardings=...)`
given exactly the shardings partir's program takes and returns. Collectives
and bytes per device come from each compiled HLO, per run (a collective inside
a loop counts once per iteration); runtime is a paired ratio (alternating runs,
medians, inputs pre-sharded, same process). Each row also gives both compiled
programs' HLO census (`hlo_stats.op_census`: fusions, transposes, copies,
collectives); on a 1-device mesh (`--mesh batch=1,model=1`) partir's is
jax.jit's. Goal: bytes <= jax.jit's on every row, ratio <= 1.

CPU caveat (see shared/guides/jax.md): 8 virtual devices share 2 cores, so
time tracks total work; only same-run paired ratios are meaningful.

    python -m benchmarks.vs_jit [--rounds 20] [--small] [--only scanned] [--mesh batch=1,model=1]
    python -m benchmarks.vs_jit --only pipeline [--profile h100-8]

The pipeline rows (`--only pipeline`, and after the table) train an 8-layer
scanned transformer step pipelined over 4 stages x 2 data shards (GPipe,
1F1B and interleaved 1F1B with 2 virtual stages) beside the same step under
DP and DP+TP on the same 8 devices: the measured step time, and the cost
model's predicted time and bubble (the stages' idle share) on `--profile`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
from jax.sharding import NamedSharding

import partir
from benchmarks.hlo_stats import collective_stats, describe, describe_census, op_census
from examples import block_train_step, cnn_train_step, mlp_train_step, scanned_stack

MESH = partir.Mesh({"batch": 4, "model": 2})
STRATEGIES = {
    "DP": [partir.BatchParallel("batch")],
    "TP": [partir.Megatron("model")],
    "DP+TP": [partir.BatchParallel("batch"), partir.Megatron("model")],
    "ZeRO-3": [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)],
}


LAYERED_ZERO3 = [
    partir.BatchParallel("batch"),
    partir.ManualPartition(
        {"params/blocks/**": {1: "batch"}, "opt_state/*/blocks/**": {1: "batch"}}
    ),
]
"""ZeRO-3 over a scanned stack: each stacked leaf split on its first non-layer dim."""

SCANNED_STRATEGIES = {
    "DP": STRATEGIES["DP"],
    "DP+TP": STRATEGIES["DP+TP"],
    "layered ZeRO-3": LAYERED_ZERO3,
}
"""For `lax.scan` over stacked layers (Megatron's column/row dims count from
the end, so they are the same on a stack)."""


CNN_DATA = partir.BatchParallel("batch")
CNN_STRATEGIES = {
    "DP": [CNN_DATA],
    "DP+channels": [
        CNN_DATA,
        partir.ManualPartition(
            {"*/layers/*/conv1/kernel": {3: "model"}, "*/down/conv1/kernel": {3: "model"}}
        ),
    ],
    "DP+out-channels": [CNN_DATA, partir.ManualPartition({"*/**/kernel": {3: "model"}})],
    "DP+rows": [CNN_DATA, partir.ManualPartition({"images": {1: "model"}})],
}
"""For the ResNet-style CNN step: data parallelism; channel parallelism (each
block's first conv splits its output channels, the second sums them); every
kernel asking for its output channels (the conflicts resolved in the actions'
order: tests/test_cnn.py); and spatial partitioning (the images' rows, with
halo exchanges)."""


def cnn(small: bool):
    """The CNN training step (examples.cnn_train_step)."""
    if small:
        return cnn_train_step.program, cnn_train_step.make_args()
    return cnn_train_step.program, cnn_train_step.make_args(batch=32, size=32, channels=32)


def scanned(small: bool):
    """The scanned transformer training step (examples.scanned_stack)."""
    if small:
        shapes = {"seq": 32, "width": 64, "mlp_width": 256}
    else:
        shapes = {"seq": 128, "width": 256, "mlp_width": 1024}
    return scanned_stack.train_step, scanned_stack.make_args(layers_=4, batch=8, **shapes)


def programs(small: bool):
    if small:
        return {
            "MLP step": (
                mlp_train_step.program,
                mlp_train_step.make_args(batch=64, d_in=128, hidden=256, d_out=64),
            ),
            "block step": (
                block_train_step.program,
                block_train_step.make_args(batch=4, seq=32, width=64, mlp_width=256),
            ),
        }
    return {
        "MLP step": (
            mlp_train_step.program,
            mlp_train_step.make_args(batch=256, d_in=512, hidden=2048, d_out=512),
        ),
        "block step": (
            block_train_step.program,
            block_train_step.make_args(batch=8, seq=128, width=256, mlp_width=1024),
        ),
    }


def baseline(program, args, compiled: partir.Compiled):
    """`jax.jit(program)` with partir's input and output shardings, on flat leaves."""
    in_tree = jax.tree_util.tree_structure(args)
    mesh = compiled.jax_mesh
    module = compiled.program
    in_shardings = tuple(NamedSharding(mesh, spec) for spec in module.IN_SPECS)
    out_shardings = tuple(NamedSharding(mesh, spec) for spec in module.OUT_SPECS)

    def flat(*leaves):
        return tuple(
            jax.tree_util.tree_leaves(program(*jax.tree_util.tree_unflatten(in_tree, leaves)))
        )

    return jax.jit(flat, in_shardings=in_shardings, out_shardings=out_shardings), in_shardings


def paired_times(first, second, inputs, rounds: int) -> tuple[float, float]:
    """Median seconds of each over `rounds` paired rounds, after 3 warm-ups;
    the two swap places every round, so neither always runs on the caches
    and allocator state the other left."""
    for _ in range(3):
        jax.block_until_ready(first(*inputs))
        jax.block_until_ready(second(*inputs))
    times: tuple[list[float], list[float]] = ([], [])
    for round_ in range(rounds):
        order = (0, 1) if round_ % 2 == 0 else (1, 0)
        for which in order:
            run = (first, second)[which]
            start = time.perf_counter()
            jax.block_until_ready(run(*inputs))
            times[which].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def measure(
    name: str, program, args, tactics, rounds: int, mesh: partir.Mesh = MESH
) -> dict[str, Any]:
    compiled = partir.jit(program, mesh=mesh, tactics=tactics).lower(*args).compile()
    reference, in_shardings = baseline(program, args, compiled)
    leaves = jax.tree_util.tree_leaves(args)
    inputs = [jax.device_put(x, s) for x, s in zip(leaves, in_shardings, strict=True)]
    ours_xla = compiled.run.lower(*inputs).compile()
    ref_xla = reference.lower(*inputs).compile()
    ours, ref = collective_stats(ours_xla.as_text()), collective_stats(ref_xla.as_text())
    ours_census, ref_census = op_census(ours_xla.as_text()), op_census(ref_xla.as_text())
    t_ours, t_ref = paired_times(compiled.run, reference, inputs, rounds)
    return {
        "name": name,
        "ours": describe(ours),
        "ref": describe(ref),
        "ours_bytes": ours.get("total", {}).get("bytes", 0),
        "ref_bytes": ref.get("total", {}).get("bytes", 0),
        "ours_ms": t_ours * 1e3,
        "ref_ms": t_ref * 1e3,
        "ratio": t_ours / t_ref,
        "ours_census": describe_census(ours_census),
        "ref_census": describe_census(ref_census),
        "ours_mem": ours_xla.memory_analysis().temp_size_in_bytes,
        "ref_mem": ref_xla.memory_analysis().temp_size_in_bytes,
    }


PIPELINE_MESH = partir.Mesh({"stage": 4, "batch": 2})
PIPELINE_STRATEGIES = {
    "pipeline GPipe M=8 (stage 4 x batch 2)": (
        PIPELINE_MESH,
        [partir.Pipeline("stage", 8, "gpipe"), partir.BatchParallel("batch")],
    ),
    "pipeline 1F1B M=8 (stage 4 x batch 2)": (
        PIPELINE_MESH,
        [partir.Pipeline("stage", 8, "1f1b"), partir.BatchParallel("batch")],
    ),
    "pipeline 1F1B M=4 (stage 4 x batch 2)": (
        PIPELINE_MESH,
        [partir.Pipeline("stage", 4, "1f1b"), partir.BatchParallel("batch")],
    ),
    "pipeline interleaved 1F1B x2 M=8 (stage 4 x batch 2)": (
        PIPELINE_MESH,
        [
            partir.Pipeline("stage", 8, "interleaved", virtual_stages=2),
            partir.BatchParallel("batch"),
        ],
    ),
    "DP (batch 8)": (partir.Mesh({"batch": 8}), [partir.BatchParallel("batch")]),
    "DP+TP (batch 4 x model 2)": (MESH, STRATEGIES["DP+TP"]),
}
"""An 8-layer scanned transformer step pipelined, beside the same step under
data and tensor parallelism on the same 8 devices."""


def pipeline_stack(small: bool):
    """The 8-layer scanned transformer step the pipeline rows train (batch 16)."""
    shapes = (
        {"seq": 32, "width": 64, "mlp_width": 256}
        if small
        else {"seq": 128, "width": 256, "mlp_width": 1024}
    )
    return scanned_stack.train_step, scanned_stack.make_args(layers_=8, batch=16, **shapes)


def measure_pipeline_rows(small: bool, rounds: int, profile: str) -> list[dict[str, Any]]:
    """Measured step time, XLA's temp buffers and the collectives of each
    strategy in `PIPELINE_STRATEGIES`, with `estimate(profile)`'s predicted time."""
    program, args = pipeline_stack(small)
    rows = []
    for name, (mesh, tactics) in PIPELINE_STRATEGIES.items():
        lowered = partir.jit(program, mesh=mesh, tactics=tactics).lower(*args)
        compiled = lowered.compile()
        module = compiled.program
        shardings = [NamedSharding(compiled.jax_mesh, spec) for spec in module.IN_SPECS]
        leaves = jax.tree_util.tree_leaves(args)
        inputs = [jax.device_put(x, s) for x, s in zip(leaves, shardings, strict=True)]
        run = compiled.run
        exe = run.lower(*inputs).compile()
        t, _ = paired_times(run, run, inputs, rounds)
        predicted = lowered.estimate(profile)
        rows.append(
            {
                "name": name,
                "collectives": describe(collective_stats(exe.as_text())),
                "ms": t * 1e3,
                "predicted_ms": predicted.seconds * 1e3,
                "bubble": predicted.bubble,
                "temp": exe.memory_analysis().temp_size_in_bytes,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="small shapes, for a quick check")
    parser.add_argument("--only", default="", help="the rows whose name contains this")
    parser.add_argument(
        "--profile",
        default="h100-8",
        help="the cost model's profile for the pipeline rows' predicted time",
    )
    parser.add_argument(
        "--mesh",
        default="",
        help='the mesh of the strategy rows, e.g. "batch=1,model=1" (default: batch=4,model=2)',
    )
    opts = parser.parse_args()
    mesh = MESH
    if opts.mesh:
        mesh = partir.Mesh(
            {name: int(size) for name, size in (a.split("=") for a in opts.mesh.split(","))}
        )
    if opts.only == "pipeline":
        print_pipeline_rows(
            measure_pipeline_rows(opts.small, opts.rounds, opts.profile), opts.profile
        )
        return
    cases = [
        (f"{prog_name} {strat}", program, args, tactics)
        for prog_name, (program, args) in programs(opts.small).items()
        for strat, tactics in STRATEGIES.items()
    ]
    program, args = scanned(opts.small)
    cases += [(f"scanned step {s}", program, args, t) for s, t in SCANNED_STRATEGIES.items()]
    program, args = cnn(opts.small)
    cases += [(f"CNN step {s}", program, args, t) for s, t in CNN_STRATEGIES.items()]
    rows = [
        measure(name, program, args, tactics, opts.rounds, mesh)
        for name, program, args, tactics in cases
        if opts.only in name
    ]
    print(
        "| program | partir collectives | jax.jit collectives | partir bytes/dev | jit bytes/dev "
        "| partir ms | jit ms | ratio | temp KiB partir/jit | partir HLO census | jit HLO census |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['ours']} | {r['ref']} | {r['ours_bytes']:,} | {r['ref_bytes']:,} "
            f"| {r['ours_ms']:.1f} | {r['ref_ms']:.1f} | {r['ratio']:.2f} "
            f"| {r['ours_mem'] // 1024:,}/{r['ref_mem'] // 1024:,} "
            f"| {r['ours_census']} | {r['ref_census']} |"
        )
    print("\nHLO census: F fusions, T transposes, C copies (every computation), coll collectives.")
    if not opts.only:
        print()
        print_pipeline_rows(
            measure_pipeline_rows(opts.small, opts.rounds, opts.profile), opts.profile
        )


def print_pipeline_rows(rows: list[dict[str, Any]], profile: str) -> None:
    print(
        f"| 8-layer scanned step, 8 devices | collectives | measured ms | predicted ms "
        f"({profile}) | predicted bubble | temp KiB |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['collectives']} | {r['ms']:.1f} | {r['predicted_ms']:.3f} "
            f"| {r['bubble']:.1%} | {int(r['temp']) // 1024:,} |"
        )


if __name__ == "__main__":
    main()
