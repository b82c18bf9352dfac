"""The op census: every op the programs partir is tested on import to has
all its pieces, so a new op cannot slip through with one missing.

For each op of the examples' programs (a CNN's among them) and of the loop,
remat, conditional, MoE, sampling and ViT programs (`tests/test_loops.py`,
`test_checkpoint.py`, `test_conditionals.py`, `test_moe.py`, `test_keys.py`,
`test_cnn.py`): reference semantics (an `@impl` the interpreter
runs), a JAX emitter, and either a registry rule (propagation tiles it) or a
one-line reason it stays whole (the report shows it). Ops inside a reduction's
or a scatter's computation are part of that op and are not counted.
"""

from __future__ import annotations

import collections
import importlib
from functools import cache

import jax
from xdsl.dialects import func
from xdsl.ir import Operation

import partir
from dialects.interpreter.chlo import ChloFunctions
from dialects.interpreter.core import PartirFunctions
from dialects.interpreter.sdy import SdyFunctions
from dialects.interpreter.stablehlo import StableHLOFunctions
from dialects.names import op_name
from examples import scanned_stack
from lowering.emittable import emittable
from rewrites.control_flow import BRANCHING_OPS
from rewrites.registry import opaque_reason, rule_for
from tests import test_checkpoint, test_cnn, test_conditionals, test_keys, test_moe

EXAMPLES = ("mlp_forward", "mlp_train_step", "block_forward", "block_train_step",
            "cross_entropy", "transformer_stack", "stack_train_step", "cnn_train_step")
CARRIERS = ("stablehlo.while", *(op.name for op in BRANCHING_OPS))
"""Ops whose regions hold ordinary program code (counted)."""


def programs() -> dict[str, tuple]:
    blocks, x = scanned_stack.mlp_args()
    shared = scanned_stack.layer(blocks, 0)
    found = {}
    for name in EXAMPLES:
        example = importlib.import_module(f"examples.{name}")
        found[name] = (example.program, example.make_args())
    scanned = scanned_stack.make_args(layers_=2)
    found.update({
        "scanned train_step": (scanned_stack.train_step, scanned),
        "scan": (scanned_stack.mlp_program, (blocks, x)),
        "fori_loop": (scanned_stack.fori_program, (shared, x)),
        "while_loop": (scanned_stack.until_program, (shared, x)),
        "remat step": (test_checkpoint.remat_step, scanned),
        "clipping cond step": (test_conditionals.clipped_step, test_conditionals.block_train_step
                               .make_args()),
        "MoE step": (test_moe.step, test_moe.make_args()),
        "nucleus sampling step": (  # the importer takes a typed key as its data
            lambda data, logits: test_keys.nucleus_step(jax.random.wrap_key_data(data), logits),
            (jax.random.key_data(jax.random.key(0)), test_keys.args()[1])),
        "ViT gradients": (jax.grad(test_cnn.vit_loss), test_cnn.vit_args()),
    })
    return found


def counted(op: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, func.FuncOp):
        if parent.name not in CARRIERS:
            return False
        parent = parent.parent_op()
    return not isinstance(op, func.FuncOp | func.ReturnOp) and op.name != "builtin.module"


@cache
def imported() -> dict[str, list[Operation]]:
    """Program -> its counted ops, as partir imports them."""
    return {
        program: [op for op in partir.import_jax(fn, *args).walk() if counted(op)]
        for program, (fn, args) in programs().items()
    }


def census() -> dict[str, collections.Counter]:
    """Op name -> how often each program uses it."""
    ops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for program, found in imported().items():
        for op in found:
            ops[op_name(op)][program] += 1
    return ops


@cache
def implemented() -> frozenset[type[Operation]]:
    return frozenset(
        op for functions in (StableHLOFunctions, ChloFunctions, PartirFunctions, SdyFunctions)
        for op, _ in functions._impls()
    )


def missing(op: Operation) -> list[str]:
    gaps = []
    if not any(isinstance(op, kind) for kind in implemented()):
        gaps.append("semantics (an @impl)")
    if not emittable(op):
        gaps.append("a JAX emitter")
    if rule_for(op) is None:
        reason = opaque_reason(op)
        if not reason.strip() or "\n" in reason:
            gaps.append("a rule or a one-line reason")
    return gaps


def test_every_op_has_semantics_an_emitter_and_a_rule_or_reason():
    gaps = {}
    for program, found in imported().items():
        for op in found:
            if missing(op):
                gaps.setdefault(op_name(op), (program, missing(op)))
    assert not gaps, gaps


def test_print_the_census():
    """The census, for the record: op, uses, and its rule or reason."""
    rows = census()
    example = {op_name(op): op for found in imported().values() for op in found}
    print(f"{len(rows)} ops in {len(programs())} programs")
    for name, uses in sorted(rows.items(), key=lambda item: -sum(item[1].values())):
        op = example[name]
        how = "rule" if rule_for(op) is not None else f"whole: {opaque_reason(op)}"
        print(f"  {name}: {sum(uses.values())} uses in {len(uses)} programs; {how}")
    assert {"stablehlo.while", "stablehlo.case", "stablehlo.optimization_barrier"} <= set(rows)


def test_a_new_op_missing_its_pieces_is_named():
    """An op partir has not given its pieces yet (an FFT) is reported with
    what it lacks."""
    import jax.numpy as jnp
    import numpy as np

    module = partir.import_jax(lambda x: jnp.fft.fft(x).real, np.ones((4, 4), np.float32))
    (fft,) = [op for op in module.walk() if op_name(op) == "stablehlo.fft"]
    assert missing(fft) == ["semantics (an @impl)", "a JAX emitter"]
