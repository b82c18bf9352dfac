"""The SPMD lowering reads each value's loop relation as the core IR was built.

`partir.partition` (the decided engine) builds each op once in its loops
(`rewrites.build_core`) and keeps, with the entry function, the relation of
each op to those loops (`rewrites.projection.BuiltRelations`); `lower_to_spmd`
annotates each per-device value from it instead of deriving it from the IR
(`LoopRelations`). Core IR from anywhere else (printed and parsed, edited,
cloned) has none, and the lowering derives the relations as before. Both
give the same SPMD program, scan loops and sums kept partial included;
where the core IR's part shapes leave a value's global shape unsure, the
built relation is the program's own shape.
"""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation

import partir
from dialects.context import make_context
from dialects.functions import entry_function
from dialects.parser import PartirParser
from dialects.partir import LoopOp
from dialects.spmd import DIST, DTensorType
from examples import block_train_step, cross_entropy, mlp_train_step, scanned_stack
from lowering.to_spmd import lower_to_spmd
from partir.partition import partition
from rewrites.projection import BuiltRelations, built_relations
from tests.test_loops import STRATEGIES, small_loop_args

MESH = partir.Mesh({"batch": 4, "model": 2})
DP = partir.BatchParallel("batch")
MEGATRON = partir.Megatron("model")

CASES = {
    "mlp-dp": (mlp_train_step.program, mlp_train_step.make_args, [DP]),
    "mlp-dp+megatron": (mlp_train_step.program, mlp_train_step.make_args, [DP, MEGATRON]),
    "mlp-manual": (
        mlp_train_step.program,
        mlp_train_step.make_args,
        [partir.ManualPartition({"x": {0: "batch"}}),
         partir.ManualPartition({"**/w*": {-1: "model"}})],
    ),
    "scan-dp+megatron": (
        scanned_stack.mlp_program, lambda: small_loop_args("mlp_program"),
        STRATEGIES["dp+megatron"],
    ),
    "fori-dp": (scanned_stack.fori_program, lambda: small_loop_args("fori_program"),
                STRATEGIES["dp"]),
    "uneven-batch-6": (cross_entropy.program, lambda: cross_entropy.make_args(batch=6), [DP]),
}


def _built(case: str):
    fn, make_args, tactics = CASES[case]
    module = partir.import_jax(fn, *make_args())
    partition(module, MESH, tactics)
    return module


def _lowered_from_text(core_text: str) -> str:
    module = PartirParser(make_context(), core_text).parse_module()
    assert built_relations(entry_function(module)) is None  # parsed: nothing recorded
    lower_to_spmd(module)
    return str(module)


@pytest.mark.parametrize("case", list(CASES))
def test_the_built_relations_lower_as_the_derived_ones(case: str) -> None:
    module = _built(case)
    core_text = str(module)
    if case != "uneven-batch-6":  # padded: the rewrite engine builds it, as before
        assert isinstance(built_relations(entry_function(module)), BuiltRelations)
    lower_to_spmd(module)
    decided = str(module)
    assert decided == _lowered_from_text(core_text)
    if case == "mlp-dp":
        assert "partial" in decided  # a gradient's sum kept partial through linear ops


def test_an_edited_function_is_not_read_as_built() -> None:
    """An op added to a loop after the build: the recorded relations no
    longer describe the function, so the lowering derives them, and lowers
    it as the same edit of the parsed core IR."""
    module = _built("mlp-dp+megatron")
    entry = entry_function(module)
    assert built_relations(entry) is not None
    clone = module.clone()  # a clone's ops were never built
    assert built_relations(entry_function(clone)) is None
    loop = next(op for op in entry.body.block.ops if isinstance(op, LoopOp))
    inner = next(op for op in loop.body.block.ops if op.name == "partir.slice")
    loop.body.block.insert_op_before(inner.clone(), loop.body.block.first_op)
    assert built_relations(entry) is None
    edited = str(module)
    lower_to_spmd(module)  # derives the relations from the IR
    assert str(module) == _lowered_from_text(edited)


def test_ops_reordered_in_a_loop_are_not_read_as_built() -> None:
    module = _built("mlp-dp+megatron")
    entry = entry_function(module)
    body = next(
        op.body.block
        for op in entry.walk()
        if isinstance(op, LoopOp)
        and [inner.name for inner in op.body.block.ops][:2] == ["partir.slice"] * 2
    )
    first = body.first_op
    assert first is not None and first.next_op is not None
    second = first.next_op
    second.detach()
    body.insert_op_before(second, first)  # two slices of outer values: still valid
    assert built_relations(entry) is None


def test_a_value_the_parts_leave_unsure_takes_the_programs_shape() -> None:
    """Under BatchParallel + Megatron, an attention bias broadcast to
    1x1x16 inside the batch loop is the same in every iteration; read off
    its part shapes, it could as well be one of 4 parts along its size-1 dim
    (4x1x32). The built relation is the program's: each annotated op's global
    type is its result type in the imported program."""
    args = block_train_step.make_args()
    module = partir.import_jax(block_train_step.program, *args)
    program: dict[int, tuple[Operation, tuple[int, ...]]] = {
        id(op): (op, tuple(op.results[0].type.get_shape()))
        for op in entry_function(module).walk()
        if len(op.results) == 1 and isinstance(op.results[0].type, TensorType)
    }
    partition(module, MESH, [DP, MEGATRON])
    core_text = str(module)
    lower_to_spmd(module)
    annotated = 0
    for op in entry_function(module).walk():
        dist = op.attributes.get(DIST)
        found = program.get(id(op))
        if found is None or found[0] is not op or not isinstance(dist, DTensorType):
            continue
        assert tuple(dist.global_type.get_shape()) == found[1], op
        annotated += 1
    assert annotated > 500
    decided = str(module)
    bias = 'dims = [2] {dist = !spmd.dtensor<1x1x32xf32, [{}, {}, {"model"}]>}'
    assert bias in decided
    derived = _lowered_from_text(core_text)
    assert bias.replace("1x1x32", "4x1x32").replace('{}, {}, {"model"}',
                                                     '{"batch"}, {}, {"model"}') in derived
    np.testing.assert_equal(len(decided.splitlines()), len(derived.splitlines()))


def test_the_default_path_reads_the_built_relations(monkeypatch) -> None:
    """`partir.jit(...).lower` lowers the function the decided engine built:
    no relation is derived from its core IR."""
    from rewrites.projection import LoopRelations

    def derived(block):
        raise AssertionError("derived the relations of a function built just now")

    monkeypatch.setattr(LoopRelations, "of", staticmethod(derived))
    fn, make_args, tactics = CASES["mlp-dp+megatron"]
    lowered = partir.jit(fn, mesh=MESH, tactics=tactics).lower(*make_args())
    assert "spmd.all_reduce" in str(lowered.module)
