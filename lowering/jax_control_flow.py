"""Control flow as JAX: `stablehlo.while` -> `lax.while_loop`,
`stablehlo.case` -> `lax.switch`, `stablehlo.if` -> `lax.cond`,
`stablehlo.optimization_barrier` -> `lax.optimization_barrier`.

The loop's regions become nested functions over the carried tuple; JAX's
lowering makes every value a region uses a carried value or a constant made
inside it, so the functions need nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects.builtin import ArrayAttr
from xdsl.ir import Block, Operation
from xdsl_jax.dialects import stablehlo as shlo

from dialects.spmd import CARRIED, VARYING, DTensorType
from lowering.jax_ir import unsupported
from lowering.jax_literals import axes_literal, tuple_literal

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter


VARYING_HELPER = '''
def _varying(x, axes):
    """`x`, varying over `axes` (shard_map's type of a value split over them)."""
    missing = tuple(a for a in axes if a not in jax.typeof(x).mat.varying)
    return lax.pcast(x, missing, to="varying") if missing else x
'''


def _carry_function(
    em: BodyEmitter,
    op: Operation,
    block: Block,
    prefix: str,
    returns_carry: bool,
    axes: list[tuple[str, ...]] | None = None,
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
        if returns_carry:
            values = _as_varying(em, values, axes)
        em.write(f"return {tuple_literal(values)}" if returns_carry else f"return {values[0]}")
    return name


def _varying_axes(op: Operation) -> list[tuple[str, ...]] | None:
    """Per carried value, the mesh axes it is split over (`spmd.CARRIED`), and
    those it differs over besides (`spmd.VARYING`)."""
    carried = op.attributes.get(CARRIED)
    extra = op.attributes.get(VARYING)
    more: list[tuple[str, ...]] = [()] * len(op.results)
    if isinstance(extra, ArrayAttr):
        if all(isinstance(e, ArrayAttr) for e in extra.data):  # per result
            more = [tuple(a.data for a in e.data) for e in extra.data]
        else:  # the same axes for every result
            more = [tuple(a.data for a in extra.data)] * len(op.results)
    if not isinstance(carried, ArrayAttr):
        return more if any(more) else None
    axes = [t.distribution.axes if isinstance(t, DTensorType) else () for t in carried]
    return [(*a, *(x for x in m if x not in a)) for a, m in zip(axes, more, strict=True)]


def _as_varying(em: BodyEmitter, names: list[str], axes: list[tuple[str, ...]] | None) -> list[str]:
    """shard_map types a loop's carry by the axes it varies over, and the
    body's result must match its input: a part made without the axis index
    (zeros sliced to a part) is cast to varying over its split axes."""
    if axes is None:
        return names
    helper = em.tables.helper("_varying", VARYING_HELPER)
    return [
        f"{helper}({n}, {axes_literal(a)})" if a else n
        for n, a in zip(names, axes, strict=True)
    ]


def _unpacked(call: str, op: Operation) -> str:
    """A call returning a tuple, as the op's results (one result unpacked)."""
    return call if len(op.results) > 1 else f"{call}[0]"


def emit_while(em: BodyEmitter, op: shlo.WhileOp) -> str:
    """`lax.while_loop(cond, body, (carried...))`; one result is unpacked."""
    axes = _varying_axes(op)
    carried = _as_varying(em, [em.name(v) for v in op.operand], axes)
    cond = _carry_function(em, op, op.cond.block, "cond", returns_carry=False)
    body = _carry_function(em, op, op.body.block, "body", returns_carry=True, axes=axes)
    return _unpacked(f"lax.while_loop({cond}, {body}, {tuple_literal(carried)})", op)


def _branch_function(
    em: BodyEmitter, op: Operation, block: Block, axes: list[tuple[str, ...]] | None
) -> str:
    """A nested `def branch_N()` running a conditional's region: it reads the
    values around it (closures) and returns its results as a tuple, typed
    as varying over the axes each result is split over (every branch alike)."""
    name = em.fresh_function("branch")
    em.write(f"def {name}():")
    with em.indented():
        *body, ret = list(block.ops)
        if ret.name != "stablehlo.return":
            raise unsupported(op, "a branch does not end in stablehlo.return")
        em.emit_ops(body)
        values = _as_varying(em, [em.name(v) for v in ret.operands], axes)
        em.write(f"return {tuple_literal(values)}")
    return name


def emit_case(em: BodyEmitter, op: shlo.CaseOp) -> str:
    """`lax.switch(index, [branches])`. StableHLO runs the last branch for an
    index out of range where `lax.switch` clamps, so the index is mapped
    first (JAX's own programs are always in range)."""
    axes = _varying_axes(op)
    branches = [_branch_function(em, op, r.block, axes) for r in op.regions]
    index, last = em.name(op.operands[0]), len(branches) - 1
    picked = f"jnp.where(({index} >= 0) & ({index} < {last}), {index}, {last})"
    return _unpacked(f"lax.switch({picked}, [{', '.join(branches)}])", op)


def emit_if(em: BodyEmitter, op: shlo.IfOp) -> str:
    """`lax.cond(pred, true_branch, false_branch)`."""
    axes = _varying_axes(op)
    true, false = (_branch_function(em, op, r.block, axes) for r in op.regions)
    return _unpacked(f"lax.cond({em.name(op.operands[0])}, {true}, {false})", op)


def emit_optimization_barrier(em: BodyEmitter, op: shlo.OptimizationBarrierOp) -> str:
    """`lax.optimization_barrier((values...))`, kept so XLA does not move the
    rematerialised computation (`jax.checkpoint`) across it.

    shard_map types a barrier's results as varying over every axis any of its
    operands varies over, so values split over different axes go through one
    barrier per set of axes (each stays as its distribution says)."""
    names = [em.name(v) for v in op.operands]
    axes = _varying_axes(op) or [()] * len(names)
    groups: dict[tuple[str, ...], list[int]] = {}
    for k, a in enumerate(axes):
        groups.setdefault(tuple(sorted(a)), []).append(k)
    if len(groups) == 1:
        return _unpacked(f"lax.optimization_barrier({tuple_literal(names)})", op)
    fenced = [""] * len(names)
    for members in groups.values():
        group = em.fresh_function("fenced")
        values = tuple_literal([names[k] for k in members])
        em.write(f"{group} = lax.optimization_barrier({values})")
        for i, k in enumerate(members):
            fenced[k] = f"{group}[{i}]"
    return tuple_literal(fenced)
