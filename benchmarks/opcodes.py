"""Work per op that does not move with the load: the Python opcodes a stage runs.

On a shared 2-core host a stage's time moves ±20% between runs, so a 5%
change cannot be seen by the clock. The number of Python opcodes the stage
executes (`sys.settrace` with `f_trace_opcodes`) moves by a few in 100,000
between runs, and follows the time (C code such as a dict's hash is not
counted). Per stage of
the N-layer training step under BatchParallel("batch") + Megatron("model") on
the 4x2 mesh: partition's opcodes per core op, to_spmd's per SPMD op, and the
functions that run the most of them. Tracing makes a stage ~30x slower: keep N small (2 takes a
minute).

    python -m benchmarks.opcodes [--layers 2] [--top 15]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def opcodes(run: Callable[[], Any]) -> tuple[Any, Counter[CodeType]]:
    """`run()`'s result, and the opcodes it executed per function."""
    counts: Counter[CodeType] = Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts[frame.f_code] += 1
        return tracer

    sys.settrace(tracer)
    try:
        result = run()
    finally:
        sys.settrace(None)
    return result, counts


def _where(code: CodeType) -> str:
    path = code.co_filename
    for marker in ("site-packages/", f"{os.getcwd()}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{code.co_firstlineno} {code.co_name}"


def measure(layers: int) -> dict[str, Any]:
    """Opcodes per op of each stage, and partition's and to_spmd's counters."""
    from examples import stack_train_step
    from lowering.to_spmd import lower_to_spmd
    from partir import BatchParallel, Megatron, Mesh, import_jax, partition

    mesh = Mesh({"batch": 4, "model": 2})
    tactics = [BatchParallel("batch"), Megatron("model")]
    module = import_jax(stack_train_step.program, *stack_train_step.make_args(layers_=layers))
    core_ops = sum(1 for _ in module.walk())
    partition(module.clone(), mesh, tactics)  # the memos a first run fills
    lower_to_spmd(partition(module.clone(), mesh, tactics).module)
    work = module.clone()
    _, parted = opcodes(lambda: partition(work, mesh, tactics))
    _, spmd = opcodes(lambda: lower_to_spmd(work))
    spmd_ops = sum(1 for _ in work.walk())
    return {
        "layers": layers,
        "core_ops": core_ops,
        "spmd_ops": spmd_ops,
        "partition": parted,
        "to_spmd": spmd,
    }


def report(row: dict[str, Any], top: int) -> str:
    n, s = row["core_ops"], row["spmd_ops"]
    partition_total = sum(row["partition"].values())
    spmd_total = sum(row["to_spmd"].values())
    lines = [
        f"{row['layers']}-layer step: {n:,} core ops, {s:,} SPMD ops",
        "",
        "| stage | opcodes | per op |",
        "|---|---|---|",
        f"| partition | {partition_total:,} | {partition_total / n:,.0f} per core op |",
        f"| to_spmd | {spmd_total:,} | {spmd_total / s:,.0f} per SPMD op |",
    ]
    for stage, counts, per in (("partition", row["partition"], n), ("to_spmd", row["to_spmd"], s)):
        total = sum(counts.values())
        lines += ["", f"{stage}: the {top} functions that run the most opcodes (their own)", "",
                  "| per op | share | function |", "|---|---|---|"]
        for code, k in counts.most_common(top):
            lines.append(f"| {k / per:,.1f} | {100 * k / total:.1f}% | {_where(code)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    options = parser.parse_args()
    print(report(measure(options.layers), options.top))


if __name__ == "__main__":
    main()
