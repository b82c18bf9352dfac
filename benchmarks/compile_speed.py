"""Compile speed at scale: every stage before XLA on the N-layer training step.

The N-layer `examples.stack_train_step` under BatchParallel("batch") +
Megatron("model") on the 4x2 mesh (8 CPU devices), one fresh process per N
so no N inherits another's caches or heap. Per N, in order:

- JAX lower: `jax.jit(fn, keep_unused=True).lower(...)` and its StableHLO,
  the input partir imports; import: StableHLO -> xDSL, calls inlined;
  partition: the tactics and propagation; to_spmd; emit (Python source);
  load (`compile` + `exec` of the source); trace: `build(mesh).trace(...)`
  of the emitted program (Python -> jaxpr); lower: that trace to StableHLO.
  µs/op is per core op up to partition, per SPMD op from to_spmd on.
  "fixpoint" is propagation alone inside partition (the worklist of
  `rewrites.factor_propagation`), the part Shardy's pass is compared with.
- partir's total before XLA: the sum of those stages (without
  `partir.jit(...).lower()`'s own extras: stage texts, `eval_shape`).
- XLA compile of that lowering, and the first run (inputs placed, results
  ready): with the stages before XLA, the sum of stages; beside it the
  first call, end to end: `partir.jit(...)(*args)` in a fresh process
  (`benchmarks.first_step`), so time that is in no stage shows at once.
- Shardy: the seconds XLA's own propagation (the `shardy-xla` pass,
  including its HLO <-> MLIR conversions) takes on the same step with the
  same input shardings, from XLA's per-pass timing log
  (`TF_CPP_VMODULE=hlo_pass_pipeline=1`) of `jax.jit(...).lower().compile()`
  in a fresh process; µs per core op, beside partir's partition.
- Above `--compile-up-to` layers (24 by default) nothing is compiled: no XLA
  stages, first call or Shardy. XLA's CPU compile of the unrolled step grows
  faster than the step (48 layers: 628 s and a 12.3 GB resident set for
  partir's program on this project's 2-core host; at 96 layers it ran the
  24 GB host out of memory), while partir's stages stay linear: the row
  still has every stage before XLA and both peak memories.
- jax.jit: `jax.jit(fn, in_shardings=<partir's input shardings>).lower(...)`
  of the same function in the same process, after `jax.clear_caches()`.
- peak memory: the resident-set high-water mark (`VmHWM`, reset through
  `/proc/self/clear_refs`) minus the resident set before: for partir over
  all its stages, for jax.jit over its lower in a second fresh process (in
  the first, jax.jit would reuse the heap partir freed and show no growth).
  What partir lets go of, the stages let go of too: JAX's lowering once
  imported, the xDSL module once emitted (before the program is traced).
  It counts C++ (MLIR, XLA) memory too, which tracemalloc would miss.

    python -m benchmarks.compile_speed [--layers 1 6 24 48 96]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

LAYERS = (1, 6, 24, 48, 96)
STAGES = ("jax_lower", "import", "partition", "to_spmd", "emit", "load", "trace", "lower")
CORE_STAGES = ("jax_lower", "import", "partition")
"""Stages whose µs/op is per core op; the rest are per SPMD op."""
XLA_STAGES = ("xla_compile", "first_run")
"""XLA's compile of partir's lowering and the first run: the first call's
stages after partir's own."""
SHARDY_PASS = "shardy-xla"
_PIPELINE = re.compile(r"Running HLO pass pipeline on module (?P<module>\S+?):")
_PASS_TIME = re.compile(r"HLO pass: (?P<name>\S+) time: .*?\((?P<us>\d+) us\)")


def _mesh() -> Any:
    from partir import Mesh

    return Mesh({"batch": 4, "model": 2})


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"{field}:\s+(\d+)", status.read()).group(1))


class PeakMemory:
    """Peak resident-set growth over a span (Linux: VmHWM reset via clear_refs)."""

    def __enter__(self) -> PeakMemory:
        gc.collect()
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        self.start = _status_kib("VmRSS")
        return self

    def __exit__(self, *_: Any) -> None:
        self.mib = (_status_kib("VmHWM") - self.start) / 1024


def _timed(seconds: dict[str, float], stage: str, run: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = run()
    seconds[stage] = time.perf_counter() - start
    return result


def _partir_stages(fn: Callable[..., Any], args: Any, jax_mesh: Any, seconds: dict) -> Any:
    """Run and time partir's stages; (core ops, SPMD ops, input specs, XLA's lowering)."""
    import jax

    from dialects.functions import entry_function
    from lowering.loader import load_source
    from lowering.to_jax import emit_jax
    from lowering.to_spmd import lower_to_spmd
    from partir import BatchParallel, Megatron, partition
    from partir.importer import (
        argument_paths,
        import_lowered,
        name_arguments,
        name_results,
        result_paths,
        uncached,
    )
    from rewrites import factor_propagation

    def import_() -> Any:
        module = import_lowered(jax_lowered.compiler_ir("stablehlo"))
        entry = entry_function(module)
        name_arguments(entry, argument_paths(fn, args))
        name_results(entry, result_paths(jax_lowered.out_info))
        return module

    jax_lowered = _timed(
        seconds, "jax_lower", lambda: jax.jit(uncached(fn), keep_unused=True).lower(*args)
    )
    module = _timed(seconds, "import", import_)
    jax_lowered = None  # as `partir.importer.import_program` lets go of it
    core_ops = sum(1 for _ in module.walk())
    tactics = [BatchParallel("batch"), Megatron("model")]
    _timed(seconds, "partition", lambda: partition(module, _mesh(), tactics))
    seconds["fixpoint"] = factor_propagation.LAST_FIXPOINT_SECONDS[0]
    _timed(seconds, "to_spmd", lambda: lower_to_spmd(module))
    spmd_ops = sum(1 for _ in module.walk())
    source = _timed(seconds, "emit", lambda: emit_jax(module, name="stack_train_step"))
    # a call lets go of the stages before the program runs (`partir.jit`);
    # collected here, untimed (the call's own collection is in the first call)
    module = None
    gc.collect()
    program = _timed(seconds, "load", lambda: load_source(source, "stack_train_step"))
    leaves = jax.tree_util.tree_leaves(args)
    traced = _timed(seconds, "trace", lambda: program.build(jax_mesh).trace(*leaves))
    xla_lowered = _timed(seconds, "lower", traced.lower)
    return core_ops, spmd_ops, program.IN_SPECS, xla_lowered


def _xla_stages(xla_lowered: Any, leaves: list[Any], in_specs: Any, jax_mesh: Any, seconds: dict):
    """Time XLA's compile of partir's lowering and the first run (inputs
    placed, results ready)."""
    import jax

    executable = _timed(seconds, "xla_compile", xla_lowered.compile)
    shardings = [jax.sharding.NamedSharding(jax_mesh, spec) for spec in in_specs]

    def first_run() -> Any:
        placed = map(jax.device_put, leaves, shardings)  # a call places its inputs too
        return jax.block_until_ready(executable(*placed))

    _timed(seconds, "first_run", first_run)


def _flat(layers: int) -> tuple[Callable[..., Any], Any, list[Any]]:
    """The step, its arguments, and the step on flat leaves (what jax.jit is given)."""
    import jax

    from examples import stack_train_step

    args = stack_train_step.make_args(layers_=layers)
    leaves, in_tree = jax.tree_util.tree_flatten(args)

    def flat(*flat_args: Any) -> Any:
        return stack_train_step.program(*jax.tree_util.tree_unflatten(in_tree, flat_args))

    return flat, args, leaves


def measure(layers: int, compile_: bool = True) -> dict[str, Any]:
    """One N's row, in this process (jax.jit's peak memory excepted); XLA's
    stages only if `compile_`."""
    import jax

    from examples import stack_train_step
    from partir.api import devices_for

    flat, args, leaves = _flat(layers)
    jax_mesh = devices_for(_mesh(), None)
    seconds: dict[str, float] = {}
    with PeakMemory() as partir_memory:
        core_ops, spmd_ops, in_specs, xla_lowered = _partir_stages(
            stack_train_step.program, args, jax_mesh, seconds
        )
    if compile_:
        _xla_stages(xla_lowered, leaves, in_specs, jax_mesh, seconds)
    jax.clear_caches()
    seconds["jax_jit"] = _jit_lower(flat, leaves, jax_mesh, in_specs)[0]
    return {
        "layers": layers,
        "core_ops": core_ops,
        "spmd_ops": spmd_ops,
        "seconds": seconds,
        "partir_mib": partir_memory.mib,
        "in_specs": [[list(e) if isinstance(e, tuple) else e for e in s] for s in in_specs],
    }


def _jit_lower(fn: Callable[..., Any], leaves: list[Any], jax_mesh: Any, in_specs: Any):
    """Seconds and peak MiB of `jax.jit(fn, in_shardings=...).lower(*leaves)`."""
    import jax
    from jax.sharding import NamedSharding

    shardings = tuple(NamedSharding(jax_mesh, spec) for spec in in_specs)
    with PeakMemory() as memory:
        start = time.perf_counter()
        jax.jit(fn, in_shardings=shardings).lower(*leaves)
    return time.perf_counter() - start, memory.mib


def _jit_compile(layers: int, in_specs: list[list[Any]]) -> str:
    """Compile `jax.jit` of the step with partir's input specs in this (fresh)
    process; the name of its HLO module, for `shardy_seconds` to find."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from partir.api import devices_for

    flat, _, leaves = _flat(layers)
    jax_mesh = devices_for(_mesh(), None)
    specs = [PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in s)) for s in in_specs]
    shardings = tuple(NamedSharding(jax_mesh, spec) for spec in specs)
    compiled = jax.jit(flat, in_shardings=shardings).lower(*leaves).compile()
    return (compiled.as_text() or "").split(",", 1)[0].removeprefix("HloModule ")


def pass_seconds(log: str, module: str, name: str = SHARDY_PASS) -> float:
    """Seconds XLA's pass `name` took on HLO module `module`, summed over its
    runs, from XLA's per-pass log (`hlo_pass_pipeline` at VLOG 1): each
    `HLO pass: <name> time: ... (<n> us)` line belongs to the module of the
    last `Running HLO pass pipeline on module <module>:` line before it."""
    current, total = None, 0
    for line in log.splitlines():
        pipeline = _PIPELINE.search(line)
        if pipeline:
            current = pipeline.group("module")
            continue
        timed = _PASS_TIME.search(line)
        if timed and timed.group("name") == name and current == module:
            total += int(timed.group("us"))
    return total / 1e6


def shardy_seconds(layers: int, in_specs: list[list[Any]]) -> float:
    """Seconds of XLA's Shardy propagation on the step with `in_specs`, in a
    fresh process whose XLA logs every pass's time."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "hlo_pass_pipeline=1"}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.compile_speed", "--shardy", str(layers),
         json.dumps(in_specs)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    module = json.loads(out.stdout.strip().splitlines()[-1])
    seconds = pass_seconds(out.stderr, module)
    if not seconds:
        raise RuntimeError(f"no {SHARDY_PASS} time for {module} in XLA's log")
    return seconds


def measure_jit_memory(layers: int, in_specs: list[list[Any]]) -> float:
    """Peak MiB of jax.jit's lower in this (fresh) process, with partir's input specs."""
    from jax.sharding import PartitionSpec

    from partir.api import devices_for

    flat, _, leaves = _flat(layers)
    specs = [PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in s)) for s in in_specs]
    return _jit_lower(flat, leaves, devices_for(_mesh(), None), specs)[1]


def _subprocess(*options: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.compile_speed", *options],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_in_subprocess(layers: int, compile_: bool = True) -> dict[str, Any]:
    from benchmarks.first_step import run_module

    row = _subprocess("--one" if compile_ else "--one-uncompiled", str(layers))
    specs = json.dumps(row["in_specs"])
    row["jit_mib"] = _subprocess("--jit-memory", str(layers), specs)
    if compile_:
        row["first_call"] = run_module("benchmarks.first_step", "--partir", str(layers))["seconds"]
        row["shardy"] = shardy_seconds(layers, row["in_specs"])
    return row


def _cell(seconds: float | None, ops: int) -> str:
    return "—" if seconds is None else f"{seconds:.2f} ({seconds / ops * 1e6:.0f})"


def table(rows: list[dict[str, Any]]) -> str:
    header = (
        "| layers | core ops | SPMD ops | "
        + " | ".join(STAGES)
        + " | fixpoint | Shardy (XLA) | partir total | jax.jit lower | ratio"
        + " | peak MiB partir | peak MiB jax.jit |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        s = row["seconds"]
        total = sum(s[stage] for stage in STAGES)
        cells = [
            _cell(s[stage], row["core_ops"] if stage in CORE_STAGES else row["spmd_ops"])
            for stage in STAGES
        ]
        lines.append(
            f"| {row['layers']} | {row['core_ops']} | {row['spmd_ops']} | "
            + " | ".join(cells)
            + f" | {_cell(s['fixpoint'], row['core_ops'])}"
            + f" | {_cell(row.get('shardy'), row['core_ops'])}"
            + f" | {total:.1f} | {s['jax_jit']:.2f} | {total / s['jax_jit']:.1f}x"
            f" | {row['partir_mib']:.0f} | {row['jit_mib']:.0f} |"
        )
    return "\n".join(lines)


def first_call_table(rows: list[dict[str, Any]]) -> str:
    """The first call end to end beside the sum of its stages (partir's
    before XLA, XLA's compile, the first run) and what is in no stage."""
    header = (
        "| layers | partir total | " + " | ".join(XLA_STAGES)
        + " | sum of stages | first call, end to end | in no stage |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        s = row["seconds"]
        if "first_call" not in row:
            continue  # not compiled (`--compile-up-to`)
        before = sum(s[stage] for stage in STAGES)
        stages = before + sum(s[stage] for stage in XLA_STAGES)
        lines.append(
            f"| {row['layers']} | {before:.2f} | "
            + " | ".join(f"{s[stage]:.2f}" for stage in XLA_STAGES)
            + f" | {stages:.2f} | {row['first_call']:.2f} | {row['first_call'] - stages:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    parser.add_argument("--compile-up-to", type=int, default=24,
                        help="compile (XLA stages, first call, Shardy) only up to this many layers")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--one-uncompiled", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--jit-memory", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--shardy", nargs=2, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one is not None:
        print(json.dumps(measure(options.one)))
        return
    if options.one_uncompiled is not None:
        print(json.dumps(measure(options.one_uncompiled, compile_=False)))
        return
    if options.jit_memory is not None:
        layers, specs = options.jit_memory
        print(json.dumps(measure_jit_memory(int(layers), json.loads(specs))))
        return
    if options.shardy is not None:
        layers, specs = options.shardy
        print(json.dumps(_jit_compile(int(layers), json.loads(specs))))
        return
    print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    rows = []
    for layers in options.layers:
        rows.append(run_in_subprocess(layers, compile_=layers <= options.compile_up_to))
        print(f"  {layers} layers done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print("seconds (µs/op: per core op up to partition and for Shardy, per SPMD op after)")
    print(table(rows))
    print("the first call: seconds")
    print(first_call_table(rows))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
