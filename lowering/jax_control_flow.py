"""Control flow as JAX: `stablehlo.while` -> `lax.while_loop`.

The loop's regions become nested functions over the carried tuple; JAX's
lowering makes every value a region uses a carried value or a constant made
inside it, so the functions need nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Block, Operation
from xdsl_jax.dialects import stablehlo as shlo

from lowering.jax_ir import unsupported
from lowering.jax_literals import tuple_literal

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter


def _carry_function(
    em: BodyEmitter, op: Operation, block: Block, prefix: str, returns_carry: bool
) -> str:
    """A nested `def prefix_N(carry)`: unpacks the carried values, runs the
    region, returns its one value (`cond`) or the new carry (`body`)."""
    name = em.fresh_function(prefix)
    params = [em.define(a) for a in block.args]
    em.write(f"def {name}(carry):")
    with em.indented():
        em.write(f"{', '.join(params)}, = carry")
        *body, ret = list(block.ops)
        if ret.name != "stablehlo.return":
            raise unsupported(op, f"its {prefix} region does not end in stablehlo.return")
        em.emit_ops(body)
        values = [em.name(v) for v in ret.operands]
        em.write(f"return {tuple_literal(values)}" if returns_carry else f"return {values[0]}")
    return name


def emit_while(em: BodyEmitter, op: shlo.WhileOp) -> str:
    """`lax.while_loop(cond, body, (carried...))`; one result is unpacked."""
    carried = [em.name(v) for v in op.operand]
    cond = _carry_function(em, op, op.cond.block, "cond", returns_carry=False)
    body = _carry_function(em, op, op.body.block, "body", returns_carry=True)
    call = f"lax.while_loop({cond}, {body}, {tuple_literal(carried)})"
    return call if len(op.results) > 1 else f"{call}[0]"
