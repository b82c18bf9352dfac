"""Each `vs_jit` row's lower bound on bytes moved per device, and how close
partir and jax.jit come to it.

Bytes are counted as `benchmarks/hlo_stats.py` counts them (an all-reduce
moves its tensor, an all-gather its result, a reduce-scatter its operand),
per device per run of the step, for f32 values. The bounds come from the
arguments' shapes and from where the strategy puts each parameter (the input
distributions partir's SPMD program takes), not from typed-in numbers:

- **Gradient sums.** Under data parallelism every parameter's gradient is a
  sum over the data axis of each device's shard: an all-reduce of the shard
  a device holds (its bytes over the axes other than the data axis). Under
  ZeRO-3 each device keeps only its part of the parameter: a reduce-scatter
  of the shard's gradient and an all-gather of the shard, each the shard's
  bytes; a stack of layers under layered ZeRO-3 is gathered once forward and
  once again backward where the backward pass reads it (matrices and norm
  scales; the strategy's memory contract: one layer's parameters whole at a
  time), its other parameters once.
- **The loss**: a scalar summed over the data axis (4 bytes) when there is one.
- **Tensor parallelism (Megatron)** over "model": every block sums two
  activations forward (after the attention's output projection and after the
  MLP's second matmul), each `batch/data x seq x width` floats per device;
  backward, the gradient at the second norm's input is summed once; the
  gradient at the first norm's output of the first block feeds only that
  norm's scale and bias gradients (nothing needs the block input's
  gradient), which are linear in it, so it is summed as two `width` vectors
  (with the gradient sums under data parallelism, where they are counted as
  parameters already). Every later block's first-norm gradient reaches the
  residual stream and is summed: `4 x blocks - 1` activation sums. The MLP step (one
  column/row pair, data as input): one forward sum of its output, nothing
  backward.
- **Batch norm under data parallelism** (the CNN): each layer's mean and
  variance are sums over the images (two channel vectors forward); backward,
  the sums it needs are its scale's and offset's gradients, already counted.

Rows whose bound depends on more than these (the CNN split over channels,
over every kernel's output channels, or over rows with halos) print "-".

    python -m benchmarks.optimum [--only block]
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from xdsl.dialects import func

import partir
from benchmarks.vs_jit import (
    CNN_STRATEGIES,
    MESH,
    SCANNED_STRATEGIES,
    STRATEGIES,
    cnn,
    measure,
    programs,
    scanned,
)
from dialects.spmd import DTensorType

DATA, MODEL = "batch", "model"
LOSS = 4


@dataclass(frozen=True)
class Row:
    """A `vs_jit` row: its program, arguments and tactics."""

    name: str
    program: Callable
    args: tuple
    tactics: list


def rows() -> list[Row]:
    out = [
        Row(f"{prog_name} {strat}", program, args, tactics)
        for prog_name, (program, args) in programs(small=False).items()
        for strat, tactics in STRATEGIES.items()
    ]
    program, args = scanned(small=False)
    out += [Row(f"scanned step {s}", program, args, t) for s, t in SCANNED_STRATEGIES.items()]
    program, args = cnn(small=False)
    out += [Row(f"CNN step {s}", program, args, t) for s, t in CNN_STRATEGIES.items()]
    return out


def parameter_shards(row: Row) -> list[tuple[int, int]]:
    """Per parameter leaf (the first argument's): the bytes of the part a
    device holds over "model", and over the data axis as well, where the
    strategy puts it (partir's SPMD program's input distributions)."""
    lowered = partir.jit(row.program, mesh=MESH, tactics=row.tactics).lower(*row.args)
    entry = next(op for op in lowered.module.walk() if isinstance(op, func.FuncOp))
    count = len(jax.tree_util.tree_leaves(row.args[0]))
    out = []
    for ty in list(entry.function_type.inputs)[:count]:
        assert isinstance(ty, DTensorType)
        dist = ty.distribution
        whole = 4 * math.prod(ty.global_type.get_shape())

        def split(axes: set[str], dist=dist) -> int:
            return math.prod(MESH.size_of(tuple(a for a in d if a in axes)) for d in dist.dims)

        out.append((whole // split({MODEL}), whole // split({MODEL, DATA})))
    return out


def _activation(x: np.ndarray, data_parallel: bool) -> int:
    """Bytes per device of one activation shaped like the input `x`."""
    return 4 * x.size // (MESH[DATA] if data_parallel else 1)


def parameter_bytes(row: Row, layers: int = 0) -> tuple[int, str]:
    """The gradient sums' bytes: an all-reduce of each shard a device holds,
    or, for a parameter split over the data axis (ZeRO-3), a reduce-scatter
    of its gradient and an all-gather of it; in a stack of `layers`, again
    backward for what the backward pass reads (matrices and norm scales: a
    bias's or an offset's gradient does not read it)."""
    total, zero = 0, False
    leaves = jax.tree_util.tree_flatten_with_path(row.args[0])[0]
    for (shard, part), (path, leaf) in zip(parameter_shards(row), leaves, strict=True):
        if part == shard:
            total += shard
            continue
        zero = True
        stacked = layers and leaf.ndim >= 2 and leaf.shape[0] == layers
        read_backward = leaf.ndim >= 3 or "scale" in jax.tree_util.keystr(path)
        total += shard * (3 if stacked and read_backward else 2)
    if not zero:
        return total, "gradient sums"
    return total, "gradient reduce-scatters + parameter all-gathers" + (
        " (a layer's forward and backward)" if layers else "")


def transformer_bound(row: Row, blocks: int, x: np.ndarray) -> tuple[int, str]:
    stacked = blocks if row.name.startswith("scanned") else 0
    tp = row.name.endswith("TP")
    data = not row.name.endswith(" TP")
    grads, how = parameter_bytes(row, stacked) if data else (0, "")
    total, parts = grads + (LOSS if data else 0), [how, "loss"] if data else []
    if tp:
        sums = 4 * blocks - 1  # 2 forward, 2 backward per block; the first folds one
        total += sums * _activation(x, data)
        parts.append(f"{sums} activation sums over model")
        if not data:  # otherwise counted with the gradient sums
            total += 2 * 4 * x.shape[-1]
            parts.append("the first norm's 2 gradient vectors")
    return total, " + ".join(parts)


def mlp_bound(row: Row) -> tuple[int, str]:
    data = not row.name.endswith(" TP")
    grads, how = parameter_bytes(row) if data else (0, "")
    total, parts = grads + (LOSS if data else 0), [how, "loss"] if data else []
    if row.name.endswith("TP"):
        y = row.args[-1]
        total += 4 * y.size // (MESH[DATA] if data else 1)
        parts.append("1 output sum over model")
    return total, " + ".join(parts)


def cnn_bound(row: Row) -> tuple[int, str] | None:
    if not row.name.endswith(" DP"):
        return None
    channels = [
        p["norm"]["scale"].size
        for p in jax.tree_util.tree_leaves(
            row.args[0], is_leaf=lambda p: isinstance(p, dict) and "norm" in p
        )
        if isinstance(p, dict)
    ]
    grads, how = parameter_bytes(row)
    return grads + 2 * 4 * sum(channels) + LOSS, f"{how} + batch norms' means and variances + loss"


def bound(row: Row) -> tuple[int, str] | None:
    """The row's lower bound in bytes per device, and what it is made of."""
    if row.name.startswith("MLP"):
        return mlp_bound(row)
    if row.name.startswith("block"):
        return transformer_bound(row, 1, row.args[2])
    if row.name.startswith("scanned"):
        blocks = jax.tree_util.tree_leaves(row.args[0]["blocks"])[0].shape[0]
        return transformer_bound(row, blocks, row.args[2])
    return cnn_bound(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="the rows whose name contains this")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    print("| program | lower bound | partir bytes/dev | jit bytes/dev | partir / bound "
          "| jit / bound | bound made of |")
    print("|---|---|---|---|---|---|---|")
    for row in rows():
        if opts.only not in row.name:
            continue
        got = bound(row)
        m = measure(row.name, row.program, row.args, row.tactics, opts.rounds)
        ours, ref = int(m["ours_bytes"]), int(m["ref_bytes"])  # type: ignore[call-overload]
        if got is None:
            print(f"| {row.name} | - | {ours:,} | {ref:,} | - | - | not derived |")
            continue
        b, how = got
        print(f"| {row.name} | {b:,} | {ours:,} | {ref:,} | {ours / b:.3f} | {ref / b:.3f} "
              f"| {how} |")


if __name__ == "__main__":
    main()
