"""`partir.report` and `partir-inspect`, checked against independent sources:
the collectives in the emitted program's jaxpr, XLA's `memory_analysis()`,
the emitted program's `IN_SPECS`, the registry and the core IR itself."""

from __future__ import annotations

import collections
import functools
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partir
from dialects.functions import entry_function
from dialects.partir import LoopOp
from examples import block_forward, block_train_step, scanned_stack
from partir import inspect as cli
from partir.report import XlaMemory, build_report, parse_module, report_text
from rewrites.conflicts import recorded_conflicts
from rewrites.registry import opaque_reason
from tests.jaxpr_collectives import axes_of, collective_eqns, emitted_collectives

MESH = partir.Mesh({"batch": 4, "model": 2})
SCRIPT = Path(sys.executable).with_name("partir-inspect")


class Built:
    """One example partitioned, compiled, and its stages written to files."""

    def __init__(self, example, tactics, tmp: Path):
        self.args = example.make_args()
        self.leaves = jax.tree_util.tree_leaves(self.args)
        self.lowered = partir.jit(example.program, mesh=MESH, tactics=tactics).lower(*self.args)
        self.compiled = self.lowered.compile()
        self.files = {}
        for stage in self.lowered.stages:
            self.files[stage.name] = tmp / f"{stage.name}.mlir"
            self.files[stage.name].write_text(stage.text)

    @functools.cached_property
    def report(self):
        return self.lowered.report()

    @functools.cached_property
    def xla_stats(self):
        """XLA's analysis of the program with inputs placed as it expects them."""
        placed = [jax.device_put(x, NamedSharding(self.compiled.jax_mesh, spec))
                  for x, spec in zip(self.leaves, self.compiled.program.IN_SPECS, strict=True)]
        return self.compiled.run.lower(*placed).compile().memory_analysis()


@pytest.fixture(scope="module")
def step(tmp_path_factory) -> Built:
    return Built(block_train_step, [partir.BatchParallel("batch"), partir.Megatron("model")],
                 tmp_path_factory.mktemp("step"))


@pytest.fixture(scope="module")
def forward(tmp_path_factory) -> Built:
    return Built(block_forward, [partir.BatchParallel("batch"), partir.Megatron("model")],
                 tmp_path_factory.mktemp("forward"))


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=120)


def jaxpr_collectives(compiled: partir.Compiled, args) -> collections.Counter:
    """(kind, axes, bytes per device) of each collective in the emitted program:
    bytes as the larger of what goes in and what comes out, from the avals."""

    def nbytes(variables) -> int:
        return sum(v.aval.size * v.aval.dtype.itemsize for v in variables)

    return collections.Counter(
        (kind, axes_of(eqn.params), max(nbytes(eqn.invars), nbytes(eqn.outvars)))
        for kind, eqn in collective_eqns(compiled, args)
    )


def spec_axes(spec, rank: int) -> tuple[tuple[str, ...], ...]:
    entries = [*tuple(spec), *[None] * (rank - len(tuple(spec)))]
    return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in entries)


# --- the SPMD stage: collectives and memory ----------------------------------


def assert_collectives_are_the_emitted(data: dict, built: Built) -> collections.Counter:
    """The reported collectives (JSON) are the emitted program's, kind, axes
    and bytes; returns them with their bytes."""
    reported = collections.Counter((c["kind"], tuple(c["axes"])) for c in data["collectives"])
    assert reported == emitted_collectives(built.compiled, built.args)
    with_bytes = collections.Counter(
        (c["kind"], tuple(c["axes"]), c["bytes_per_device"]) for c in data["collectives"])
    assert with_bytes == jaxpr_collectives(built.compiled, built.args)
    return with_bytes


def test_json_collectives_match_the_emitted_forward(forward, capsys):
    code, out, _ = run_main([str(forward.files["spmd"]), "--format", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    with_bytes = assert_collectives_are_the_emitted(data, forward)
    assert data["bytes_communicated_per_device"] == sum(
        n * size for (_, _, size), n in with_bytes.items())


def test_console_script_collectives_match_the_emitted_step(step):
    done = run_script(str(step.files["spmd"]), "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert_collectives_are_the_emitted(data, step)
    # every collective says which op needed it and which action caused it
    assert all(c["needed_by"] and c["tactic"] in ("BatchParallel", "Megatron")
               for c in data["collectives"])
    assert data["memory"]["arguments_bytes_per_device"] == step.xla_stats.argument_size_in_bytes


def test_inspect_reads_a_scanned_step_with_collectives_inside_its_loops(tmp_path, capsys):
    """A `lax.scan` training step under DP + Megatron: `partir-inspect` on the
    SPMD stage lists the collectives inside the loops (as the emitted jaxpr
    has them, with their bytes), knows every loop result's sharding, and reads
    the core stage, where the loops are whole ops run on the devices' parts."""
    example = types.SimpleNamespace(
        program=scanned_stack.train_step, make_args=lambda: scanned_stack.make_args(layers_=2)
    )
    built = Built(example, [partir.BatchParallel("batch"), partir.Megatron("model")], tmp_path)
    code, out, _ = run_main([str(built.files["spmd"]), "--format", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert_collectives_are_the_emitted(data, built)
    in_loops = collections.Counter(c["loop"] for c in data["collectives"])
    assert len(in_loops) == 3, in_loops  # the forward loop, the backward loop, and outside
    assert all(loop is None or loop.endswith("stablehlo.while") for loop in in_loops)
    loop_values = [v for v in data["values"] if v["op"] == "stablehlo.while"]
    assert loop_values and all(v["properties"] != "unknown" for v in loop_values)
    code, out, _ = run_main([str(built.files["Megatron"]), "--format", "json"], capsys)
    assert code == 0
    core = json.loads(out)
    loops = [r for r in core["replicated_ops"] if r["op"] == "stablehlo.while"]
    assert len(loops) == 2 and all("carried" in r["detail"] for r in loops)


@pytest.mark.parametrize("which", ["forward", "step"])
def test_argument_bytes_equal_xla_exactly(which, request):
    built: Built = request.getfixturevalue(which)
    assert built.report.memory.arguments == built.xla_stats.argument_size_in_bytes


def test_argument_shardings_are_the_emitted_in_specs(step):
    specs = step.compiled.program.IN_SPECS
    arguments = step.report.arguments
    assert len(arguments) == len(specs) == len(step.leaves)
    for arg, spec, leaf in zip(arguments, specs, step.leaves, strict=True):
        assert arg.distribution.dims == spec_axes(spec, np.ndim(leaf)), arg.partir_name
        parts = arg.distribution.parts(MESH)
        assert arg.local_shape == tuple(n // k for n, k in zip(np.shape(leaf), parts, strict=True))


def test_text_shows_the_peak_estimate_beside_xla(step):
    stats = step.xla_stats
    report = step.report.with_xla(XlaMemory.of(step.compiled, step.args))
    text = report.to_text()
    summary = text.split("\n\n")[0]
    assert f"{report.memory.peak} B" in summary
    assert f"{stats.argument_size_in_bytes + stats.temp_size_in_bytes} B" in summary
    assert f"outputs {stats.output_size_in_bytes} B" in summary
    # the estimate counts every intermediate and output as materialised: an
    # upper-bound-style figure next to XLA's total after fusion and reuse
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes
             + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
    assert report.memory.peak >= total
    assert report.to_json()["xla_memory"]["temporaries_bytes_per_device"] == stats.temp_size_in_bytes


def test_rich_rendering_keeps_bracketed_names(step):
    buf = io.StringIO()
    cli.print_tables(step.report.tables()[:2], buf, rich=True, width=200)
    assert "params['attn']['wq']" in buf.getvalue()
    assert "\x1b[" in buf.getvalue()  # drawn for a terminal


# --- the import and core stages ------------------------------------------------


def test_import_stage_is_replicated_without_collectives(step):
    report = report_text(step.lowered.stage("import"), "import.mlir")
    assert report.stage == "stablehlo" and not report.collectives
    assert report.bytes_communicated == 0
    known = [v for v in report.values if v.properties is not None]
    assert len(known) == len(report.values)
    assert {p for v in known for p in v.properties.values()} == {"B"}
    assert all(v.local_shape == v.global_shape for v in report.values)
    # every op is outside every loop: nothing was partitioned yet
    body = [op for op in entry_function(parse_module(step.lowered.stage("import"))).body.block.ops]
    assert len(report.replicated_ops) == len(body) - 1  # all but func.return


def conflict_program(x, y):
    window = jax.lax.reduce_window(  # two operands: opaque
        (x, y), (-jnp.inf, jnp.inf),
        lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1])), (2, 1), (2, 1), "VALID",
    )
    return jnp.argsort(x, axis=0), x + y, jnp.max(x, axis=0), jnp.argmax(x, axis=1), window


@pytest.fixture(scope="module")
def core_stage(tmp_path_factory):
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    module = partir.import_jax(conflict_program, x, x)
    tactic = partir.ManualPartition({"x": {0: "batch"}, "y": {1: "batch"}})
    done = partir.partition(module, partir.Mesh({"batch": 4}), [tactic], keep_stages=True)
    path = tmp_path_factory.mktemp("core") / "core.mlir"
    path.write_text(done.stages[-1].text)
    return done, path


def test_core_stage_lists_replicated_ops_with_reasons(core_stage, capsys):
    done, path = core_stage
    code, out, _ = run_main([str(path), "--format", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["stage"] == "core"
    rows = {r["name"]: r for r in data["replicated_ops"]}
    core = parse_module(path.read_text())
    entry = entry_function(core)
    top = [op for op in entry.body.block.ops if not isinstance(op, LoopOp)][:-1]
    assert len(rows) == len(top)  # exactly the ops outside every loop
    by_op = collections.defaultdict(list)
    for r in data["replicated_ops"]:
        by_op[(r["op"], r["reason"])].append(r)
    windows = [op for op in top if op.name == "stablehlo.reduce_window"]
    assert [r["detail"] for r in by_op[("stablehlo.reduce_window", "opaque")]] == [
        opaque_reason(windows[0])
    ]
    (argsort,) = by_op[("stablehlo.sort", "blocked")]  # along the tiled dim
    assert "dim 0" in argsort["detail"] and "sorted dim" in argsort["detail"]
    # argmax along the other dim runs on each device's rows (a loop per result)
    assert not [op for op in top if op.name == "stablehlo.reduce" and len(op.results) > 1]
    (blocked,) = by_op[("stablehlo.reduce", "blocked")]  # max over the tiled dim
    assert "dim 0" in blocked["detail"] and "batch" in blocked["detail"]
    # the conflict is reported as recorded, and its op is not replicated: the
    # earlier action wins and tiles it (the loser is redistributed instead)
    assert [tuple(c["values"]) for c in data["conflicts"]] == [c.values for c in done.conflicts]
    assert data["conflicts"][0]["winner"] == done.conflicts[0].winner
    (add,) = [op for op in core.walk() if op.name == "stablehlo.add"]
    loop = add.parent_op()
    assert isinstance(loop, LoopOp) and loop.origin.describe() == done.conflicts[0].winner
    assert not by_op[("stablehlo.add", "conflict")]
    assert {c["kind"] for c in data["collectives"]} == {"all_gather", "all_to_all"}


CONFLICT_AT_TOP = """builtin.module attributes {partir.conflicts = [#partir.conflict<op = "stablehlo.add", axis = "batch", values = ["x", "y"], winner = "action 1 (ManualPartition of x)", loser = "action 2 (ManualPartition of y)", detail = "operand 0 is tiled on dim 0, operand 1 on dim 1">]} {
  partir.mesh @mesh ["batch" = 4]
  func.func public @main(%x: tensor<8x8xf32> {partir.name = "x"}, %y: tensor<8x8xf32> {partir.name = "y"}, %z: tensor<8x8xf32> {partir.name = "z"}) -> (tensor<8x8xf32>, tensor<8x8xf32>) {
    %0 = stablehlo.add %x, %y : tensor<8x8xf32>
    %1 = stablehlo.add %z, %z : tensor<8x8xf32>
    func.return %0, %1 : tensor<8x8xf32>, tensor<8x8xf32>
  }
}
"""


def test_an_op_named_by_a_conflict_record_carries_it():
    """A core module whose record names an op left outside every loop (by
    kind and by the values reaching it): the op carries the record."""
    module = parse_module(CONFLICT_AT_TOP)
    report = build_report(module)
    (record,) = recorded_conflicts(module)
    reasons = {r.name: r for r in report.replicated_ops}
    assert reasons["%0"].reason == "conflict" and reasons["%0"].conflict == record
    assert reasons["%1"].reason == "untiled"  # same kind, but x and y do not reach it


# --- diff ----------------------------------------------------------------------------


def test_diff_of_import_and_megatron_shows_the_changed_arguments(tmp_path):
    args = block_forward.make_args()
    lowered = partir.jit(block_forward.program, mesh=MESH,
                         tactics=[partir.Megatron("model")]).lower(*args)
    specs = lowered.compile().program.IN_SPECS
    a, b = tmp_path / "import.mlir", tmp_path / "megatron.mlir"
    a.write_text(lowered.stage("import"))
    b.write_text(lowered.stage("Megatron"))
    done = run_script(str(a), str(b))
    assert done.returncode == 0, done.stderr
    names = [v.partir_name for v in report_text(lowered.stage("import")).arguments]
    split = {n for n, spec in zip(names, specs, strict=True) if any(e is not None for e in spec)}
    assert split  # Megatron split some weights
    starred = {line.split()[2] for line in done.stdout.splitlines()
               if line.startswith("*") and line.split()[1] == "argument"}
    assert starred == split
    data = json.loads(run_script(str(a), str(b), "--format", "json").stdout)
    changed = sum(row["changed"] for row in data["rows"])
    assert done.stdout.rstrip().endswith(f"{changed} of {len(data['rows'])} changed")
    for row in data["rows"]:
        if row["kind"] == "argument" and row["changed"]:
            assert row["before"] == "batch=B, model=B" and "model=S(" in row["after"]


# --- errors ---------------------------------------------------------------------------


def test_malformed_file_is_one_message_with_line_and_column(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("builtin.module {\n  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
                   "    %0 = stablehlo.add %x, %x : tensor<4xf3\n  }\n}\n")
    done = run_script(str(bad))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: {bad}:3:")
    assert "Traceback" not in done.stderr and not done.stdout


def test_missing_file_no_entry_and_traceback_flag(tmp_path, capsys, monkeypatch):
    code, _, err = run_main([str(tmp_path / "absent.mlir")], capsys)
    assert code == 1 and "cannot read" in err and "Traceback" not in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("builtin.module {\n}\n"))
    code, _, err = run_main(["-"], capsys)
    assert code == 1 and err.startswith("error: <stdin>: expected one public func.func")
    with pytest.raises(cli.InspectError):
        cli.main([str(tmp_path / "absent.mlir"), "--traceback"])
