"""StableHLO as xdsl-jax defines it, with the gaps partir met closed.

`xdsl_jax.dialects.stablehlo` is the array dialect; this module only replaces
what JAX emits but xdsl-jax 0.6 cannot represent:

- `stablehlo.compare`: JAX writes the optional comparison type under StableHLO's
  own property name `compare_type` (`#stablehlo<comparison_type FLOAT>`);
  xdsl-jax calls it `comparison_type` and rejects the real name. `CompareOp`
  below is the same op with the property spelled as StableHLO spells it.
"""

from __future__ import annotations

from xdsl.dialects.builtin import AnyTensorType, TensorType, i1
from xdsl.ir import Dialect, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import NoMemoryEffect
from xdsl_jax.dialects import stablehlo as _xj
from xdsl_jax.dialects.stablehlo.attributes import (
    ComparisonDirection,
    ComparisonDirectionAttr,
    ComparisonType,
    ComparisonTypeAttr,
)
from xdsl_jax.dialects.stablehlo.types import PredTensorType
from xdsl_jax.xdsl_extras.traits import Elementwise, SameOperandsAndResultShape


@irdl_op_definition
class CompareOp(IRDLOperation):
    """`stablehlo.compare` with StableHLO's `compare_type` property."""

    name = "stablehlo.compare"

    assembly_format = (
        "$comparison_direction `,` $lhs `,` $rhs (`,` $compare_type^)? "
        "attr-dict `:` functional-type(operands, results)"
    )

    lhs = operand_def(AnyTensorType)
    rhs = operand_def(AnyTensorType)
    result = result_def(PredTensorType)
    comparison_direction = prop_def(ComparisonDirectionAttr)
    compare_type = opt_prop_def(ComparisonTypeAttr)

    traits = traits_def(NoMemoryEffect(), Elementwise(), SameOperandsAndResultShape())

    def __init__(
        self,
        lhs: SSAValue,
        rhs: SSAValue,
        direction: ComparisonDirection,
        compare_type: ComparisonType | None = None,
    ):
        assert isinstance(lhs.type, TensorType)
        props = {"comparison_direction": ComparisonDirectionAttr(direction)}
        if compare_type is not None:
            props["compare_type"] = ComparisonTypeAttr(compare_type)
        super().__init__(
            operands=[lhs, rhs],
            result_types=[TensorType(i1, lhs.type.get_shape())],
            properties=props,
        )


def _stablehlo_dialect() -> Dialect:
    replaced = {CompareOp.name: CompareOp}
    ops = [replaced.get(op.name, op) for op in _xj.StableHLO.operations]
    return Dialect("stablehlo", ops, list(_xj.StableHLO.attributes))


StableHLO = _stablehlo_dialect()
