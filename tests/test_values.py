"""Values inside the program, named by `@`-reference (`partir.values`) and
tiled by `ManualPartition`: the report lists each replicated op's reference,
pasting it tiles that value, and a reference that names nothing is a clear
error."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from dialects.functions import entry_function
from partir.importer import import_program
from partir.opt import main as opt_main
from partir.partition import partition
from partir.values import ValueReference, ValueReferenceError, find_value, references
from tests.numerics import assert_close

MESH = partir.Mesh({"batch": 4, "model": 2})


def with_table(tokens, kernel):
    """A step whose largest values no argument reaches: a table built from
    iota (as positional encodings and masks are), reduced into the output."""
    n = 256
    i = jnp.arange(n, dtype=jnp.float32)
    table = jnp.sin(i[:, None] * i[None, :] / n)
    for _ in range(3):
        table = jnp.tanh(table) * 1.01
    return jnp.tanh(tokens @ kernel) + table.mean(axis=1)[:16]


def table_args():
    rng = np.random.default_rng(0)
    return rng.random((32, 24), np.float32), rng.random((24, 16), np.float32)


BATCH = partir.BatchParallel("batch", inputs="tokens")


def _replicated(lowered, op: str):
    return [r for r in lowered.report().replicated_ops if r.op == op]


def test_a_reference_from_the_report_tiles_the_value_it_names():
    args = table_args()
    before = partir.jit(with_table, mesh=MESH, tactics=[BATCH]).lower(*args)
    tanhs = _replicated(before, "stablehlo.tanh")
    assert len(tanhs) == 3 and all(r.reference for r in tanhs)
    last = tanhs[-1].reference
    assert last.startswith("@jit(with_table)/tanh at test_values.py:")
    tactics = [BATCH, partir.ManualPartition({last: {-2: "model"}})]
    lowered = partir.jit(with_table, mesh=MESH, tactics=tactics).lower(*args)
    # the whole stretch moved into loops over "model": backward to the iota's
    # broadcasts, forward into the reduction (a sum loop, then an all-reduce)
    assert not _replicated(lowered, "stablehlo.tanh")
    assert not _replicated(lowered, "stablehlo.sine")
    kinds = {(c.kind, c.axes) for c in lowered.report().collectives}
    assert ("all_gather", ("model",)) in kinds or ("all_reduce", ("model",)) in kinds
    assert_close(np.asarray(lowered.compile()(*args)), np.asarray(jax.jit(with_table)(*args)))


def test_every_reference_names_the_op_it_was_read_from():
    module = import_program(with_table, *table_args()).module
    partition(module, MESH, [BATCH])
    entry = entry_function(module)
    found = references(entry)
    assert len(set(found.values())) == len(found)  # each names one op
    for op, reference in found.items():
        parsed = ValueReference.parse(reference)
        assert parsed.text == reference
        if len(op.results) == 1:
            assert find_value(entry, reference) is op.results[0]


def test_references_that_name_nothing_are_clear_errors():
    args = table_args()
    module = import_program(with_table, *args).module
    entry = entry_function(module)
    ref = next(r for op, r in references(entry).items() if op.name == "stablehlo.tanh")
    missing = ref.rsplit("#", 1)[0] + "#9"
    with pytest.raises(ValueReferenceError, match=r"no #9.*references with that name stack"):
        find_value(entry, missing)
    with pytest.raises(ValueReferenceError, match="names no op"):
        ValueReference.parse("@#2")
    with pytest.raises(ValueReferenceError, match="not a value reference"):
        ValueReference.parse("tokens")
    fn = partir.jit(with_table, mesh=MESH, tactics=[BATCH, partir.ManualPartition({missing: {0: "model"}})])
    with pytest.raises(partir.TacticError, match="no #9"):
        fn.lower(*args)
    fn = partir.jit(with_table, mesh=MESH, tactics=[partir.ManualPartition({ref: {0: "nope"}})])
    with pytest.raises(partir.TacticError, match="nope"):
        fn.lower(*args)  # the axis is checked with the plan, before any rewrite
    fn = partir.jit(with_table, mesh=MESH, tactics=[partir.ManualPartition({ref: {2: "model"}})])
    with pytest.raises(ValueError, match=r"@jit\(with_table\)/tanh.*dim 2 is out of range"):
        fn.lower(*args)


def two_results(keys, values):
    k, v = jax.lax.sort((keys, values), num_keys=1)
    return k * v


def test_an_op_with_several_results_is_refused_by_name():
    args = (np.arange(8, dtype=np.float32)[::-1].copy(), np.ones(8, np.float32))
    module = import_program(two_results, *args).module
    entry = entry_function(module)
    ref = next(r for op, r in references(entry).items() if op.name == "stablehlo.sort")
    with pytest.raises(ValueReferenceError, match=r"stablehlo.sort.*2 results"):
        find_value(entry, ref)


def test_an_uneven_dim_is_padded_like_an_argument_s():
    args = table_args()
    before = partir.jit(with_table, mesh=MESH, tactics=[BATCH]).lower(*args)
    (reduced,) = [
        r for r in _replicated(before, "stablehlo.slice")
    ]  # table.mean(axis=1)[:16]: 16 rows
    mesh = partir.Mesh({"batch": 2, "model": 3})
    lowered = partir.jit(
        with_table, mesh=mesh,
        tactics=[BATCH, partir.ManualPartition({reduced.reference: {0: "model"}})],
    ).lower(*args)
    assert_close(np.asarray(lowered.compile()(*args)), np.asarray(jax.jit(with_table)(*args)))


def test_partir_opt_takes_a_reference_in_its_spec(tmp_path, capsys):
    args = table_args()
    lowered = partir.jit(with_table, mesh=MESH, tactics=[BATCH]).lower(*args)
    ref = _replicated(lowered, "stablehlo.tanh")[-1].reference
    imported = tmp_path / "import.mlir"
    imported.write_text(lowered.stage("import", locations=True), encoding="utf-8")
    out = tmp_path / "core.mlir"
    pipeline = (
        'partir-declare-mesh{axes="batch=4","model=2"},'
        'partir-batch-parallel{axis=batch inputs="tokens"},'
        f'partir-manual-partition{{spec="{ref}:0=model"}}'
    )
    status = opt_main([str(imported), "-p", pipeline, "-o", str(out)])
    assert status in (0, None), capsys.readouterr().err
    again = partir.jit(
        with_table, mesh=MESH, tactics=[BATCH, partir.ManualPartition({ref: {0: "model"}})]
    ).lower(*args)
    # partir-opt's passes run the rewrite engine, the stages the decided
    # path; the programs are the same (their loops' locations may differ)
    assert out.read_text(encoding="utf-8").strip() == again.stages[-2].text.strip()


def test_hostile_names_in_a_reference_are_escaped_and_still_paste():
    """A reference carries the user's function, scope and file names: tables
    escape it to one line, and pasted as a Python literal it names the value."""
    from dialects.escaping import readable
    from partir.search import schedule_source
    from tests.test_locations import HOSTILE_FILE, HOSTILE_PROGRAM, HOSTILE_SCOPE

    namespace = {"jax": jax, "jnp": jnp, "SCOPE": HOSTILE_SCOPE}
    exec(compile(HOSTILE_PROGRAM, HOSTILE_FILE, "exec"), namespace)
    program: Any = namespace["program"]
    x, w = np.ones((8, 16), np.float32), np.full((16, 8), 0.1, np.float32)
    lowered = partir.jit(program, mesh=MESH, tactics=[]).lower(x, w)
    (tanh,) = _replicated(lowered, "stablehlo.tanh")
    assert HOSTILE_SCOPE in tanh.reference and "\n" in tanh.reference
    text = str(lowered.report())
    assert readable(tanh.reference) in text
    assert not any(line.startswith(("#import os", "# x = 1")) for line in text.splitlines())
    pasted = schedule_source([partir.ManualPartition({tanh.reference: {0: "batch"}})])
    assert "\n" not in pasted
    tactics = eval(pasted, {"partir": partir})
    assert list(tactics[0].spec) == [tanh.reference]
    again = partir.jit(program, mesh=MESH, tactics=tactics).lower(x, w)
    assert not _replicated(again, "stablehlo.tanh")
    want = jax.jit(program)(x, w)
    for g, e in zip(again.compile()(x, w), want, strict=True):
        assert_close(np.asarray(g), np.asarray(e))


def test_tiling_whole_values_of_a_training_step_keeps_jax_jit_numbers():
    """References the report lists, on a step nobody wrote for them (the
    block's training step after BatchParallel: its replicated update, norms
    and masks), each tiled on its first dim the model axis divides: the
    numbers stay `jax.jit`'s. (25 such references, two dims each, were
    checked the same way while building this.)"""
    import random

    from examples import block_train_step

    args = block_train_step.make_args()
    before = partir.jit(block_train_step.program, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    rows = [
        r for r in before.lower(*args).report().replicated_ops
        if r.reference and r.op != "stablehlo.constant"
    ]
    want = jax.tree.leaves(jax.jit(block_train_step.program)(*args))
    checked = 0
    for row in random.Random(0).sample(rows, 4):
        module = import_program(block_train_step.program, *args).module
        partition(module, MESH, [partir.BatchParallel("batch")])
        value = find_value(entry_function(module), row.reference)
        shape = value.type.get_shape()
        dim = next((d for d, n in enumerate(shape) if n >= 2 and n % 2 == 0), None)
        if dim is None:
            continue
        tactics = [partir.BatchParallel("batch"), partir.ManualPartition({row.reference: {dim: "model"}})]
        lowered = partir.jit(block_train_step.program, mesh=MESH, tactics=tactics).lower(*args)
        got = jax.tree.leaves(lowered.compile()(*args))
        for g, w in zip(got, want, strict=True):
            assert_close(np.asarray(g), np.asarray(w))
        checked += 1
    assert checked >= 3
