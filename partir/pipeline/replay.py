"""A step's jaxpr run again at cut shapes, for a step that fixes its layer count.

The Pipeline traces a step with each stacked leaf cut to one stage's layers.
A step that fixes the count in its code cannot be called at those shapes:
flax's `nn.scan(length=...)` hands `lax.scan` its module's length, which no
longer matches the stacked parameters. Its jaxpr can still run there: each
equation is bound again on the cut operands, so shapes follow the operands,
and a scan takes its length from its stacked operands (its body is one
layer's, the same at any count). Calls (`jit`, `custom_jvp_call`, `remat`)
are run inline, since their inner jaxprs are typed at the old shapes.

What this cannot redo is a size fixed in a shape parameter (a `reshape` or
`broadcast_in_dim` to the old layer count): binding it fails, and the
Pipeline reports that the step fixes a size it cuts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, JaxprEqn

from partir.pipeline.equations import CALLS, called, run_eqn, run_jaxpr


def replay(closed: ClosedJaxpr, shapes: Sequence[jax.ShapeDtypeStruct]) -> ClosedJaxpr:
    """`closed` traced again with inputs shaped `shapes`."""

    def run(*args: Any) -> list[Any]:
        return run_jaxpr(closed.jaxpr, closed.consts, args, _again)

    return jax.make_jaxpr(run)(*shapes)


def _again(_: int, eqn: JaxprEqn, operands: list[Any]) -> list[Any]:
    """One equation bound anew: a call's jaxpr inline, a scan over as many
    steps as its stacked operands now hold."""
    name = eqn.primitive.name
    if name in CALLS:
        return run_jaxpr(*called(eqn), operands, _again)
    if name == "scan":
        xs = operands[eqn.params["num_consts"] + eqn.params["num_carry"] :]
        if xs:
            eqn = eqn.replace(params={**eqn.params, "length": xs[0].shape[0]})
    return run_eqn(eqn, operands)
