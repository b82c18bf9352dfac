"""`dialects.op_kinds.per_op_kind`: a class-only fact, found once per op class,
answering for subclasses as `isinstance` does (partir's `stablehlo_ext.WhileOp`
subclasses xdsl_jax's, and an exact-type table once missed it)."""

from __future__ import annotations

from xdsl.dialects import test as xdsl_test
from xdsl_jax.dialects import stablehlo as xj

from dialects import stablehlo_ext
from dialects.op_kinds import per_op_kind


class _DerivedTestOp(xdsl_test.TestOp):
    """A Python subclass, as `stablehlo_ext.WhileOp` is of xdsl_jax's."""


def test_a_fact_is_found_once_per_class_and_subclasses_answer_as_isinstance():
    asked: list[type] = []

    @per_op_kind
    def is_test_op(op) -> bool:
        asked.append(type(op))
        return isinstance(op, xdsl_test.TestOp)

    ops = [xdsl_test.TestOp.create(), xdsl_test.TestOp.create(), _DerivedTestOp.create(), _DerivedTestOp.create()]
    assert [is_test_op(op) for op in ops] == [True, True, True, True]
    assert asked == [xdsl_test.TestOp, _DerivedTestOp]


def test_partirs_while_is_a_stablehlo_while():
    assert issubclass(stablehlo_ext.WhileOp, xj.WhileOp)
    assert stablehlo_ext.WhileOp is not xj.WhileOp
