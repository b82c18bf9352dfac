"""Which ops of an imported program partir can run, asked before partitioning.

Partitioning keeps every array op as it is (each device runs it on its part),
so an op the JAX emitter cannot write (`lowering.jax_ops.EMITTERS`, the one
table of what can be emitted) would fail only at the very end, after all the
partitioning work. `refuse_unemittable` asks the same table right after
import and refuses the program, naming each such op, where the user's code
made it, and the nearest alternative partir does support.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Operation
from xdsl.passes import ModulePass, PassPipeline

from dialects.names import op_name
from dialects.partir import Partir
from dialects.sdy import ManualComputationOp
from dialects.spmd import SPMD
from dialects.stablehlo_collectives import COLLECTIVE_OPS, DeviceCollectiveOp
from lowering.jax_ir import UnsupportedOpError, op_position
from lowering.jax_ops import EMITTERS

STRUCTURAL = frozenset(
    {
        "builtin.module", "func.func", "func.call", "func.return", "stablehlo.return",
        "sdy.mesh", "sdy.manual_computation", "sdy.return",
    }
)
"""Ops that are program structure, not computation: modules and functions
(calls are inlined), region terminators their parent op's emitter reads,
JAX's own mesh declaration (partir declares its mesh itself), and a manual
region, whose body the SPMD lowering places per device
(`dialects.manual_regions`)."""

_CALLBACKS = (
    "host callbacks (jax.debug.print, jax.debug.callback, jax.pure_callback, io_callback) "
    "and backend library calls do not partition: call them outside the partir.jit "
    "function (return the value and print or process it there)"
)

ALTERNATIVES: dict[str, str] = {
    "stablehlo.fft": "a DFT is a dot with the DFT matrix (jnp.exp(-2j * jnp.pi * "
    "jnp.outer(k, t) / n) @ x)",
    "stablehlo.custom_call": _CALLBACKS,
    "stablehlo.after_all": _CALLBACKS,
    "stablehlo.create_token": _CALLBACKS,
    "stablehlo.rng": "draw with jax.random (a threefry or rbg key), which partir supports",
    "stablehlo.cholesky": "factorise outside the partir.jit function",
    "stablehlo.triangular_solve": "solve outside the partir.jit function",
    "stablehlo.map": "apply the function elementwise with jnp ops (vectorised), not lax.map",
    **{
        op.name: "call the collective inside a nested jax.shard_map (partir inserts the "
        "collectives its own partitioning needs)"
        for op in COLLECTIVE_OPS
    },
}
"""The nearest supported way to compute what an unsupported op computes."""

DEFAULT_ALTERNATIVE = "compute it outside the partir.jit function"


PARTIR_OPS = frozenset(op.name for dialect in (Partir, SPMD) for op in dialect.operations)
"""partir's own ops (`partir-opt` reads any stage): the SPMD lowering and the
collective emitters own them (tests/test_spmd_coverage.py checks they do)."""


def _in_manual_region(op: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, ManualComputationOp):
        parent = parent.parent_op()
    return parent is not None


def emittable(op: Operation) -> bool:
    """Whether the emitter can write `op`: a StableHLO collective can where
    JAX wrote it, in a nested shard_map (`dialects.manual_regions` reads it
    as partir's `spmd` op)."""
    name = op_name(op)
    if isinstance(op, DeviceCollectiveOp):
        return _in_manual_region(op)
    return name in STRUCTURAL or name in EMITTERS or name in PARTIR_OPS


def _label(op: Operation) -> str:
    name = op_name(op)
    target = op.attributes.get("call_target_name") or op.properties.get("call_target_name")
    return f"{name} @{target.data}" if isinstance(target, StringAttr) else name


def unemittable_ops(module: ModuleOp) -> list[Operation]:
    """The first op of each kind the emitter cannot write (not looking inside
    an op already refused), in program order."""
    found: dict[str, Operation] = {}

    def visit(op: Operation) -> None:
        if not emittable(op):
            found.setdefault(_label(op), op)
            return
        for region in op.regions:
            for block in region.blocks:
                for inner in block.ops:
                    visit(inner)

    visit(module)
    return list(found.values())


def refuse_unemittable(module: ModuleOp, where: Callable[[Operation], str | None]) -> None:
    """Raise `UnsupportedOpError` naming every kind of op partir cannot emit,
    with `where(op)` (the user's source line) and the alternative."""
    refused = unemittable_ops(module)
    if not refused:
        return
    parts = []
    for op in refused:
        location = where(op)
        at = f" at {location}" if location else ""
        hint = ALTERNATIVES.get(op_name(op), DEFAULT_ALTERNATIVE)
        parts.append(f"{_label(op)}{at}: instead, {hint}")
    raise UnsupportedOpError(
        "partir cannot partition this program (refused before partitioning); "
        + "; ".join(parts)
    )


def refusing_unemittable(pipeline: PassPipeline) -> PassPipeline:
    """`pipeline`, refusing the module before its first pass if it holds an op
    the emitter cannot write (`partir-opt` with `partir-emit-jax`: the same
    early refusal `partir.jit` gives, with the op's position in the text)."""
    inner = pipeline.callback

    def callback(done: ModulePass | None, module: ModuleOp, following: ModulePass | None) -> None:
        if done is None:
            refuse_unemittable(module, op_position)
        if inner is not None:
            inner(done, module, following)

    return PassPipeline(pipeline.passes, callback)
