"""A training step's layer loops, found on the IR: what a pipeline splits.

A step that differentiates a loss through a `lax.scan` over stacked layers
(flax's `nn.scan`, haiku's `layer_stack`, an equinox stack) has two counted
loops over the same rows (`dialects.counted_loops`): the *forward* loop,
reading one layer of the stacked parameters per iteration, and the
*backward* loop JAX's transpose made, running the rows in reverse. Which
other values are stacked (carry the layer dim) is a question of factors, so
the registry's rules answer it: every op joins the dims of its operands and
results that run over one factor, so the parameters, the optimizer state
that mirrors them and the updated values join the loops' rows. This reads
the same in the import and in the SPMD form.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects.counted_loops import CountedLoop, counted_loop
from dialects.errors import PartirValueError
from dialects.escaping import quoted
from dialects.functions import entry_function
from dialects.spmd import CollectiveOp, FromLocalOp, ToLocalOp
from rewrites.registry import rule_for


class PipelineError(PartirValueError):
    """A step `Pipeline` cannot split into stages, with what to change."""


@dataclass(frozen=True)
class LayerLoops:
    """Where a step's layer loops are, and which of its values are stacked."""

    forward: CountedLoop
    backward: CountedLoop | None
    """None for a step without a backward loop (a forward pass alone)."""
    layers: int
    layer_dim: dict[SSAValue, int]
    """Per value of the entry function (arguments and its ops' results), the
    dim that runs over the layers, for those that have one."""


def find_layer_loops(module: ModuleOp, axis: str = "stage") -> LayerLoops:
    """The layer loops of `module`'s entry function, or a `PipelineError`
    naming what does not fit a pipeline over `axis` and what to do."""
    entry = entry_function(module)
    body = list(entry.body.block.ops)
    loops = [
        loop
        for op in body
        if (loop := counted_loop(op)) is not None and loop.reads and loop.reverse is not None
    ]
    forwards = [loop for loop in loops if not loop.reverse]
    backwards = [loop for loop in loops if loop.reverse]
    if not forwards:
        raise PipelineError(
            f"Pipeline({quoted(axis)}): the step has no loop over stacked layers (a "
            "lax.scan reading one layer of its stacked parameters per step); write the "
            "layers as a lax.scan (flax nn.scan, haiku layer_stack) to pipeline them"
        )
    if len(forwards) > 1 or len(backwards) > 1:
        raise PipelineError(
            f"Pipeline({quoted(axis)}): the step has {len(forwards)} forward and "
            f"{len(backwards)} backward loops over stacked layers; Pipeline splits one "
            "stack: scan the layers once, or pipeline the stacks as separate steps"
        )
    forward = forwards[0]
    backward = backwards[0] if backwards else None
    if backward is not None and backward.trips != forward.trips:
        raise PipelineError(
            f"Pipeline({quoted(axis)}): the backward loop runs {backward.trips} rows and "
            f"the forward loop {forward.trips}; Pipeline needs the backward of the same scan"
        )
    rows = _LayerRows((forward, backward) if backward is not None else (forward,))
    for op in body:
        for a, b in _same_factor(op):
            rows.union(a, b)
    layer_loops = {loop.op: loop for loop in (forward, backward) if loop is not None}
    for op in body:
        if not isinstance(op, shlo.WhileOp):
            continue
        loop = layer_loops.get(op)
        by_rows = {*loop.reads, *loop.writes} if loop is not None else set()
        whole = [v for k, v in enumerate(op.operands) if rows.is_layers(v) and k not in by_rows]
        if loop is backward and any(v.owner is forward.op for v in whole):
            raise PipelineError(
                f"Pipeline({quoted(axis)}): the backward loop reads a value the forward loop "
                "saved per layer for the whole batch, each microbatch taking its part of every "
                "layer at once (random bits drawn for the batch inside the layer loop, as a "
                "dropout mask): draw them per example, or per microbatch, inside the loop"
            )
        if whole:
            raise PipelineError(
                f"Pipeline({quoted(axis)}): a loop reads or writes the stacked layers other "
                "than one layer per step (as the gradient of a fori_loop does, by the "
                "indices its forward saved): a stage could not tell its own layers; write "
                "the layers as a lax.scan over the stacked parameters"
            )
    layer_dim = {
        v: d
        for v in (*entry.body.block.args, *(r for op in body for r in op.results))
        if (d := next((d for d in range(_rank(v)) if rows.is_layers(v, d)), None)) is not None
    }
    return LayerLoops(forward, backward, forward.trips, layer_dim)


class _LayerRows:
    """Union-find over (value, dim): the dims that run over the loops' rows,
    seeded with dim 0 of the values the loops read and write a row of (the
    two loops' rows are the same layers)."""

    def __init__(self, loops: tuple[CountedLoop, ...]) -> None:
        self.parent: dict[tuple[SSAValue, int], tuple[SSAValue, int]] = {}
        self.root = (loops[0].op.operands[(loops[0].reads + loops[0].writes)[0]], 0)
        for loop in loops:
            for k in (*loop.reads, *loop.writes):
                self.union((loop.op.operands[k], 0), self.root)

    def find(self, key: tuple[SSAValue, int]) -> tuple[SSAValue, int]:
        path = []
        while (up := self.parent.get(key, key)) != key:
            path.append(key)
            key = up
        for k in path:
            self.parent[k] = key
        return key

    def union(self, a: tuple[SSAValue, int], b: tuple[SSAValue, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

    def is_layers(self, value: SSAValue, dim: int = 0) -> bool:
        return dim < _rank(value) and self.find((value, dim)) == self.find(self.root)


def _same_factor(op: Operation) -> Iterator[tuple[tuple[SSAValue, int], tuple[SSAValue, int]]]:
    """Pairs of (value, dim) that run over one factor of `op`; a loop (a
    barrier) carries each dim of a value to the same dim of its result."""
    if isinstance(op, shlo.WhileOp) or op.name == "stablehlo.optimization_barrier":
        for operand, result in zip(op.operands, op.results, strict=True):
            for d in range(_rank(result)):
                yield (operand, d), (result, d)
        return
    if isinstance(op, ToLocalOp | FromLocalOp | CollectiveOp):
        # a device's part of a value, or a collective over it: each dim keeps its meaning
        for d in range(min(_rank(op.operands[0]), _rank(op.results[0]))):
            yield (op.operands[0], d), (op.results[0], d)
        return
    rule = rule_for(op)
    places: dict[int, list[tuple[SSAValue, int]]] = {}  # per factor, the dims it is major in
    for values, dims in ((op.operands, rule.operands), (op.results, rule.results)) if rule else ():
        for value, factors in zip(values, dims, strict=False):  # a rule may omit operands
            for d, f in enumerate(factors):
                if f:
                    places.setdefault(f[0], []).append((value, d))
    for same in places.values():
        for place in same[1:]:
            yield same[0], place


def _rank(value: SSAValue) -> int:
    ty = value.type
    if isinstance(ty, TensorType):
        return ty.get_num_dims()
    global_type = getattr(ty, "global_type", None)
    return global_type.get_num_dims() if isinstance(global_type, TensorType) else 0
