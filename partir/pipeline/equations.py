"""Running a jaxpr's equations one at a time: how the pipeline takes a step apart.

The engine runs a step's segments in its own order, the replay runs a jaxpr
again at cut shapes, the ONNX export unrolls its loops, Megatron's segments
and the estimate wrap single equations as functions: each is this loop
over equations with its own way to run some of them (a `Runner`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, JaxprEqn, Literal, Var

Env = dict[Any, Any]
Runner = Callable[[int, JaxprEqn, list[Any]], list[Any]]
"""Runs equation number `i` on its operands' values, returning its results'."""

CALLS = {
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


def called(eqn: JaxprEqn) -> tuple[Jaxpr, Sequence[Any]]:
    """The jaxpr a call (`CALLS`) or a scan runs, and its constants."""
    inner = eqn.params[CALLS.get(eqn.primitive.name, "jaxpr")]
    if isinstance(inner, ClosedJaxpr):
        return inner.jaxpr, inner.consts
    return inner, ()


def read_atom(env: Env, atom: Any) -> Any:
    """The value of a jaxpr atom (a variable, or a literal) in `env`."""
    return atom.val if isinstance(atom, Literal) else env[atom]


def read_atoms(env: Env, atoms: Sequence[Any]) -> list[Any]:
    return [read_atom(env, v) for v in atoms]


def write_atoms(env: Env, outvars: Sequence[Any], values: Sequence[Any]) -> None:
    """Bind an equation's results in `env` (a dropped result is not kept)."""
    for var, value in zip(outvars, values, strict=True):
        if not isinstance(var, DropVar):
            env[var] = value


def run_eqn(eqn: JaxprEqn, operands: list[Any]) -> list[Any]:
    """One jaxpr equation on `operands`, as `jax.core.eval_jaxpr` runs it."""
    out = eqn.primitive.bind(*operands, **eqn.primitive.get_bind_params(eqn.params))
    return list(out) if eqn.primitive.multiple_results else [out]


def eqn_function(eqn: JaxprEqn) -> Callable[..., list[Any]]:
    """One equation as a function of its operands."""
    return lambda *operands: run_eqn(eqn, list(operands))


def run_eqns(
    eqns: Sequence[JaxprEqn], env: Env, runner: Runner | None = None, first: int = 0
) -> None:
    """Run `eqns` (numbered from `first`) on `env`, each by `runner` (default:
    `run_eqn`), binding their results in it."""
    for i, eqn in enumerate(eqns, first):
        operands = read_atoms(env, eqn.invars)
        outs = runner(i, eqn, operands) if runner else run_eqn(eqn, operands)
        write_atoms(env, eqn.outvars, outs)


def run_jaxpr(
    jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any], runner: Runner | None = None
) -> list[Any]:
    """`jaxpr`'s results on `args`, each equation run by `runner`."""
    env: Env = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    run_eqns(jaxpr.eqns, env, runner)
    return read_atoms(env, jaxpr.outvars)


def inputs_of(eqns: Sequence[JaxprEqn], outvars: Sequence[Any]) -> list[Any]:
    """The variables `eqns` (and `outvars`) read that they do not make, in
    order of first read: what a run of a jaxpr's equations takes."""
    made = {v for eqn in eqns for v in eqn.outvars}
    found: dict[Any, None] = {}
    for atom in [*(v for eqn in eqns for v in eqn.invars), *outvars]:
        if isinstance(atom, Var) and atom not in made:
            found.setdefault(atom)
    return list(found)
