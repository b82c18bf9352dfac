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
from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr

INLINED = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}
"""Call primitives, by the parameter holding the jaxpr they call."""


def replay(closed: ClosedJaxpr, shapes: Sequence[jax.ShapeDtypeStruct]) -> ClosedJaxpr:
    """`closed` traced again with inputs shaped `shapes`."""

    def run(*args: Any) -> list[Any]:
        return _run(closed.jaxpr, closed.consts, args)

    return jax.make_jaxpr(run)(*shapes)


def _run(jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    from partir.pipeline.engine import read_atoms, run_eqn

    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        operands = read_atoms(env, eqn.invars)
        name = eqn.primitive.name
        if name in INLINED:
            inner = eqn.params[INLINED[name]]
            if isinstance(inner, ClosedJaxpr):
                outs = _run(inner.jaxpr, inner.consts, operands)
            else:
                outs = _run(inner, (), operands)
        elif name == "scan":
            outs = run_eqn(_with_length(eqn, operands), operands)
        else:
            outs = run_eqn(eqn, operands)
        for var, value in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, DropVar):
                env[var] = value
    return read_atoms(env, jaxpr.outvars)


def _with_length(eqn: Any, operands: Sequence[Any]) -> Any:
    """The scan `eqn` over as many steps as its stacked operands now hold."""
    xs = operands[eqn.params["num_consts"] + eqn.params["num_carry"] :]
    if not xs:
        return eqn
    return eqn.replace(params={**eqn.params, "length": xs[0].shape[0]})
