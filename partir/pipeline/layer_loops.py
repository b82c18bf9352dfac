"""A training step's layer loops, found on the IR: what a pipeline splits.

A step that differentiates a loss through a `lax.scan` over stacked layers
(flax's `nn.scan`, haiku's `layer_stack`, an equinox stack under `lax.scan`)
has two counted loops over the same rows (`dialects.counted_loops`) in its
entry function: the *forward* loop, which reads one layer of the stacked
parameters per iteration and writes the residuals, and the *backward* loop
JAX's transpose made, which runs the rows in reverse and writes the stacked
gradients. The ops before, between and after them are the step's *pre*
(embedding), *head* (the loss and its gradient) and *update* (the optimizer).

Which other values are stacked, that is, carry the layer dim, is a question
of factors, so the registry answers it (`rewrites.registry.rule_for`): the
rows the loops read and write are one factor, and every op's rule joins the
dims of its operands and results that run over one factor. An argument or a
result whose dim 0 joins the loops' rows is split over the stages with
them: the parameters, the optimizer state that mirrors them, the updated
values. This reads the same in the import and in the SPMD form.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr, TensorType
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
    stacked_arguments: tuple[int, ...]
    """Entry arguments (flat leaf indices) whose dim 0 is the layers."""
    stacked_results: tuple[int, ...]
    """Entry results whose dim 0 is the layers."""
    layer_dim: dict[SSAValue, int]
    """Per value of the entry function (arguments and its ops' results), the
    dim that runs over the layers, for those that have one."""
    pre: tuple[Operation, ...]
    head: tuple[Operation, ...]
    update: tuple[Operation, ...]
    """The entry function's ops before the forward loop, between the loops,
    and after the last one (its return excluded)."""


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
    rows = _LayerRows(entry)
    for loop in (forward, backward):
        if loop is not None:
            rows.seed(loop)
    rows.propagate(body)
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
        if (d := rows.layer_dim(v)) is not None
    }
    args = tuple(i for i, a in enumerate(entry.body.block.args) if rows.is_layers(a))
    returned = entry.body.block.last_op
    assert returned is not None
    results = tuple(i for i, v in enumerate(returned.operands) if rows.is_layers(v))
    first = body.index(forward.op)
    last = body.index((backward or forward).op)
    return LayerLoops(
        forward,
        backward,
        forward.trips,
        args,
        results,
        layer_dim,
        tuple(body[:first]),
        tuple(body[first + 1 : last]) if backward is not None else (),
        tuple(op for op in body[last + 1 :] if op is not returned),
    )


def argument_name(entry: func.FuncOp, index: int) -> str:
    """The user's name of entry argument `index` (its pytree path), quoted."""
    attrs = entry.arg_attrs
    name = None
    if attrs is not None:
        name = attrs.data[index].data.get("partir.name")
    return quoted(name.data) if isinstance(name, StringAttr) else f"argument {index}"


class _LayerRows:
    """Union-find over (value, dim): the dims that run over the loops' rows."""

    def __init__(self, entry: func.FuncOp) -> None:
        self.entry = entry
        self.parent: dict[tuple[SSAValue, int], tuple[SSAValue, int]] = {}
        self.roots: set[tuple[SSAValue, int]] = set()

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

    def seed(self, loop: CountedLoop) -> None:
        """The rows a loop reads and writes: dim 0 of those carried values."""
        anchor = (loop.op.operands[(loop.reads + loop.writes)[0]], 0)
        self.roots.add(anchor)
        for k in (*loop.reads, *loop.writes):
            self.union((loop.op.operands[k], 0), anchor)

    def propagate(self, ops: list[Operation]) -> None:
        """Join the dims each top-level op's rule runs over one factor; a loop
        carries each dim of a value to the same dim of its result."""
        for op in ops:
            for a, b in _same_factor(op):
                self.union(a, b)

    def is_layers(self, value: SSAValue, dim: int = 0) -> bool:
        if dim >= _rank(value):
            return False
        key = self.find((value, dim))
        return any(self.find(root) == key for root in self.roots)

    def layer_dim(self, value: SSAValue) -> int | None:
        return next((d for d in range(_rank(value)) if self.is_layers(value, d)), None)


def _same_factor(op: Operation) -> Iterator[tuple[tuple[SSAValue, int], tuple[SSAValue, int]]]:
    """Pairs of (value, dim) that run over one factor of `op`."""
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
    if rule is None:
        return
    for f in range(len(rule.factors)):
        places = [
            (op.operands[j], d)
            for j, dims in enumerate(rule.operands)
            for d in range(len(dims))
            if rule.operand_factor(j, d) == f
        ] + [
            (op.results[i], d)
            for i, dims in enumerate(rule.results)
            for d in range(len(dims))
            if rule.result_factor(i, d) == f
        ]
        for place in places[1:]:
            yield places[0], place


def _rank(value: SSAValue) -> int:
    ty = value.type
    if isinstance(ty, TensorType):
        return ty.get_num_dims()
    global_type = getattr(ty, "global_type", None)
    return global_type.get_num_dims() if isinstance(global_type, TensorType) else 0
