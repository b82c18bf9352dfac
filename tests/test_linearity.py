"""The registry's linearity claims (`rewrites.registry.LINEAR`), on numbers.

An op linear in a set of operands turns partial sums into partial sums: split
each operand of the set into parts that sum to it (as devices holding a
partial sum do), run the op on part i of each with the other operands whole,
and the results must sum to the op's result. The SPMD lowering relies on
exactly this to carry a partial value through the op instead of reducing it
first (`lowering.to_spmd`). Every op in `LINEAR` must be checked here.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from xdsl.ir import BlockArgument

from dialects.interpreter import run_function
from rewrites.registry import LINEAR, linear_operands
from tests.test_registry_properties import (
    BOOL,
    GENERATORS,
    INT,
    REAL,
    Case,
    assert_same_numbers,
    op_line,
    op_under_test,
    parse,
    rngs,
    shapes,
    tensor_type,
)
from tests.test_registry_properties import (
    PARTS as PARTS_DRAWN,
)

PARTS = 3

LINEAR_FORMS = sorted(
    k for k, g in GENERATORS.items() if g.op in LINEAR and not g.xfail
)


def split(value: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """`PARTS` arrays of `value`'s dtype summing to it."""
    if value.dtype.kind in "iu":
        parts = [rng.integers(-3, 4, size=value.shape).astype(value.dtype) for _ in range(PARTS - 1)]
    else:
        parts = [rng.standard_normal(value.shape).astype(value.dtype) for _ in range(PARTS - 1)]
    return [*parts, (value - sum(parts)).astype(value.dtype)]


CHECKED: dict[str, int] = {}
"""Per op name, the linearity claims checked (for the coverage test)."""


def check_linearity(case: Case) -> int:
    """Each operand set the op is linear in, split into parts; returns how
    many sets were checked (those whose operands are all arguments)."""
    module = parse(case.text())
    op = op_under_test(module)
    if not linear_operands(op):
        return 0
    whole = run_function(module, case.args)
    checked = 0
    rng = np.random.default_rng(0)
    for operands in linear_operands(op):
        values = [op.operands[i] for i in sorted(operands)]
        if not all(isinstance(v, BlockArgument) for v in values):
            continue
        args = {v.index for v in values}  # type: ignore[attr-defined]
        if any(case.args[i].dtype.kind not in "iufc" for i in args):
            continue
        parts = {i: split(case.args[i], rng) for i in args}
        total = None
        for j in range(PARTS):
            inputs = [parts[i][j] if i in parts else a for i, a in enumerate(case.args)]
            got = run_function(module, inputs)[0]
            total = got if total is None else total + got
        assert_same_numbers(np.asarray(total), np.asarray(whole[0]),
                            f"{op.name} linear in operands {sorted(operands)}:\n{module}")
        checked += 1
        CHECKED[op.name] = CHECKED.get(op.name, 0) + 1
    return checked


@pytest.mark.parametrize("case_id", LINEAR_FORMS)
def test_a_linear_op_of_partial_sums_is_a_partial_sum(case_id: str) -> None:
    checked = 0

    @seed(zlib.crc32(case_id.encode()))
    @settings(max_examples=8, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(GENERATORS[case_id].cases)
    def property_holds(case: Case) -> None:
        nonlocal checked
        checked += check_linearity(case)

    property_holds()
    print(f"{case_id}: {checked} linearity claims checked")


def test_every_linear_op_is_checked_on_numbers() -> None:
    """Each op `LINEAR` names had a claim checked above (in this process: the
    parametrized tests run first; under xdist each worker checks its share,
    so this test checks all the forms itself)."""
    for case_id in LINEAR_FORMS:
        if GENERATORS[case_id].op not in CHECKED:
            test_a_linear_op_of_partial_sums_is_a_partial_sum(case_id)
    missing = sorted(set(LINEAR) - set(CHECKED))
    assert not missing, f"no linearity claim of {missing} was checked on numbers"


@st.composite
def masks(draw: st.DrawFn) -> Case:
    """`select(pred, x, zeros)`: the mask padding puts on a sum's operand
    (`rewrites.padding`), linear in `x` alone since the other branch is 0."""
    parts = draw(PARTS_DRAWN)
    shape = draw(shapes(parts))
    domain = draw(st.sampled_from([REAL, INT]))
    rng = draw(rngs)
    args = (BOOL(rng, shape), domain(rng, shape))
    pred_t, t = (tensor_type(a.shape, a.dtype) for a in args)
    zero = "0.0" if domain is REAL else "0"
    lines = (
        op_line("stablehlo.constant", [], [], t, f"value = dense<{zero}> : {t}", result="%zeros"),
        op_line("stablehlo.select", ["%arg0", "%arg1", "%zeros"], [pred_t, t, t], t),
    )
    return Case(parts, args, lines, t)


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(masks())
def test_a_mask_is_linear_in_what_it_masks(case: Case) -> None:
    op = op_under_test(parse(case.text()))
    assert frozenset({1}) in linear_operands(op)
    assert check_linearity(case) == 1
