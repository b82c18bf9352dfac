"""A per-microbatch SPMD program run as a pipeline schedule over a stage axis.

The step was partitioned as any other, with one more tactic: the batch split
over a *microbatch* axis, minor to the others, so every value's sharding is
decided per microbatch and the program's collectives over that axis are
where microbatches meet (the gradients and the loss they add up to). This
pass turns that axis into time, the layer loops split over the stage axis
(`layer_loops`, `stage_loops`). Per time step of the schedule (a table,
`partir.pipeline.schedule`) each stage runs its forward or backward loop on
its own layers, on the microbatch the table gives it: the first stage on the
*pre* ops' output, the others on what their neighbour sent by
`spmd.collective_permute` (exactly the stages that send that step). The last
stage runs the *head* (loss and its gradient), the first the ops after the
backward loop, each under `stablehlo.if` on the stage index. A sum over
microbatches becomes a sum over time steps; a value one stage made that
every device returns is all-reduced over the stage axis once; the ops that
do not depend on the batch (the update) run once on each stage's rows,
completed across stages where the registry's rule makes a layer dim a sum
(`_retype_stacked`). Under the interleaved schedule a stage holds several
chunks: the loops run one chunk's rows and the stacked values are dealt to
the chunks' stages once a step (`deal_chunks`). What does not fit is a
`PipelineError` naming the op (a batch statistic across microbatches, a
per-example result, a value the backward reads from the head besides its
gradient).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, ModuleOp, TensorType, i1, i32
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl_jax.dialects import stablehlo as shlo

from dialects.counted_loops import CountedLoop, constant_int
from dialects.distribution import Distribution
from dialects.escaping import quoted
from dialects.functions import entry_function
from dialects.mesh import Mesh
from dialects.names import op_name
from dialects.regions import combiner_name
from dialects.spmd import (
    CARRIED,
    DIST,
    AllReduceOp,
    AxisIndexOp,
    CollectiveOp,
    CollectivePermuteOp,
    DTensorType,
    FromLocalOp,
    LocalSliceOp,
    ToLocalOp,
)
from dialects.stablehlo_collectives import REDUCTIONS
from partir.pipeline.builder import Builder, stacked
from partir.pipeline.layer_loops import LayerLoops, PipelineError, find_layer_loops
from partir.pipeline.schedule import Action, Schedule, make_schedule
from partir.pipeline.stage_loops import deal_chunks, split_rows
from partir.pipeline.tactic import MICROBATCH_AXIS
from partir.tiling import module_mesh
from rewrites.registry import FactorKind, OpRule, rule_for

LINEAR = frozenset(
    {"stablehlo.transpose", "stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.convert"}
)
"""Ops a sum over microbatches passes through unchanged (linear, one operand)."""

Key = tuple[str, object]
"""What the schedule keeps, by kind ("act", "res", "grad", "seed", "w", "sum")
and the carried position (the sum) it is of."""


def pipeline(
    module: ModuleOp,
    *,
    axis: str,
    stages: int,
    microbatches: int,
    schedule: str = "gpipe",
    virtual_stages: int = 1,
    microbatch_axis: str = MICROBATCH_AXIS,
) -> None:
    """Rewrite the per-microbatch SPMD `module` (its mesh has `microbatch_axis`)
    as the pipelined program over `axis` (see the module docstring), its
    schedule recorded on the module (`Schedule.record`)."""
    table = make_schedule(schedule, stages, microbatches, virtual_stages)
    Pipelining(module, axis, stages, microbatch_axis, table).run()
    table.record(module, axis)


class Pipelining:
    def __init__(
        self, module: ModuleOp, axis: str, stages: int, mb_axis: str, schedule: Schedule
    ) -> None:
        self.module, self.axis, self.mb, self.schedule = module, axis, mb_axis, schedule
        self.S, self.M, self.chunks = stages, schedule.microbatches, schedule.chunks
        self.entry = entry_function(module)
        self.mesh_size = dict(module_mesh(module, "Pipeline").axes)
        self.loops: LayerLoops = find_layer_loops(module, axis)
        if self.loops.backward is None:
            raise self.error(
                "the step has no backward layer loop; Pipeline pipelines training steps"
            )
        self.forward: CountedLoop = self.loops.forward
        self.backward: CountedLoop = self.loops.backward

    def error(self, what: str) -> PipelineError:
        return PipelineError(f"Pipeline({quoted(self.axis)}): {what}")

    # --- reading the per-microbatch program -----------------------------------------------

    def run(self) -> None:
        block = self.entry.body.block
        ops = list(block.ops)
        self.partial_writes = self._strip_inner_sums()
        self.varying, self.sums = self._varying(ops)  # a sum's result is never varying
        f_at, b_at = ops.index(self.forward.op), ops.index(self.backward.op)
        each = [(i, op) for i, op in enumerate(ops) if self._is_varying(op)]
        self.pre = [op for i, op in each if i < f_at and not isinstance(op, ToLocalOp)]
        self.head = [op for i, op in each if f_at < i < b_at]
        self.post = [op for i, op in each if i > b_at and not isinstance(op, FromLocalOp)]
        after = self._after_sums(ops)
        invariant = [
            op
            for op in ops
            if not self._is_varying(op)
            and op not in self.sums
            and op not in (self.forward.op, self.backward.op)
            and not isinstance(op, ToLocalOp | FromLocalOp | func.ReturnOp)
        ]
        self.before_ops = [op for op in invariant if op not in after]
        self.after_ops = [op for op in invariant if op in after]
        for op in (*self.pre, *self.head, *self.post):
            if any(v.owner in after for v in op.operands):
                raise self.error(
                    f"{op_name(op)} of each microbatch reads a value made from the whole "
                    "batch's sum (a batch statistic across microbatches); compute it per "
                    "microbatch, or do not pipeline this step"
                )
        if any(isinstance(op, FromLocalOp) and op.operands[0] in self.varying for op in ops):
            raise self.error(
                "the step returns a per-example value; Pipeline returns what the step "
                "adds up over the batch (the loss, the updated state)"
            )
        self._retype_stacked(invariant)
        if self.chunks > 1 and self.forward.trips % (self.S * self.chunks):
            raise self.error(
                f"{self.forward.trips} layers do not split into {self.S} stages x "
                f"{self.chunks} virtual stages; give the stack a multiple of "
                f"{self.S * self.chunks} layers, or fewer virtual_stages"
            )
        self.chunk_rows = self.forward.trips // (self.S * self.chunks)
        split_rows(self.forward, self.S * self.chunks, self.axis)
        split_rows(self.backward, self.S * self.chunks, self.axis)
        self._build(block, ops)

    def _strip_inner_sums(self) -> dict[int, tuple[str, ...]]:
        """Sums over the microbatch axis inside the backward loop (its per-layer
        gradients, summed over the other data axes too) become per-microbatch
        values the loop writes: the writes they reach are added up over the
        microbatches after it, and summed over the other axes once, at the end
        (a layer's gradient moves once a step, not once a microbatch)."""
        partial: dict[int, tuple[str, ...]] = {}
        for loop in (self.forward, self.backward):
            body = loop.op.body.block
            returned = body.last_op
            assert returned is not None
            for inner in list(loop.op.walk()):
                if not isinstance(inner, CollectiveOp) or self.mb not in inner.axis_names:
                    continue
                if isinstance(inner, LocalSliceOp):
                    self._check_own_part(inner)
                    continue  # the microbatch's part, taken per time step (`_own_parts`)
                if (
                    not isinstance(inner, AllReduceOp)
                    or inner.combines != "sum"
                    or loop is self.forward
                ):
                    raise self.error(
                        f"the layer loop's {op_name(inner)} over the microbatch axis combines "
                        "microbatches inside the layers (a batch statistic); compute it per "
                        "microbatch, or do not pipeline this step"
                    )
                k = self._written_linearly(inner, body, returned)
                if k is None or not _is_zeros(loop.op.operands[k]):
                    made = inner.input.owner
                    what = op_name(made) if isinstance(made, Operation) else "a value"
                    raise self.error(
                        f"the backward loop sums {what} over microbatches where it does not "
                        "only accumulate a layer's gradient"
                    )
                rest = tuple(a for a in inner.axis_names if a != self.mb)
                if partial.setdefault(k, rest) != rest:
                    raise self.error(
                        "the backward loop sums parts of one gradient over different axes"
                    )
                Rewriter.replace_op(inner, [], [inner.input])
            _partial_carries(loop.op, {k: v for k, v in partial.items() if v})
        return partial

    @staticmethod
    def _written_linearly(op: Operation, body: Block, returned: Operation) -> int | None:
        """The carried position a value reaches through linear ops and one
        row write, or None."""
        value = op.results[0]
        while True:
            uses = list(value.uses)
            if len(uses) != 1:
                return None
            user = uses[0].operation
            if user.name in LINEAR or (user.name == "stablehlo.reduce" and _reducer(user) == "sum"):
                value = user.results[0]
                continue
            if user.name != "stablehlo.dynamic_update_slice" or uses[0].index != 1:
                return None
            target = user.operands[0]
            if target not in body.args:
                return None
            k = body.args.index(target)
            return k if returned.operands[k] is user.results[0] else None

    def _varying(self, ops: list[Operation]) -> tuple[set[SSAValue], list[Operation]]:
        """The values that differ per microbatch, and the sums over microbatches."""
        varying: set[SSAValue] = set()
        sums: list[Operation] = []  # in program order: the final all-reduces' order
        for op in ops:
            if isinstance(op, ToLocalOp):
                ty = op.operands[0].type
                if isinstance(ty, DTensorType) and self.mb in ty.distribution.axes:
                    varying.add(op.results[0])
                continue
            reads = any(v in varying for v in op.operands)
            if isinstance(op, LocalSliceOp) and self.mb in op.axis_names:
                self._check_own_part(op)
                varying.add(op.results[0])
                continue
            if isinstance(op, CollectiveOp) and self.mb in op.axis_names:
                if not isinstance(op, AllReduceOp) or op.combines != "sum":
                    raise self.error(
                        f"{op_name(op)} over the microbatch axis joins microbatches (a "
                        "contrastive loss, a batch statistic); Pipeline needs each microbatch's "
                        "examples to be computed apart"
                    )
                sums.append(op)
                continue
            if reads and op is self.backward.op:  # not its stacked results or counter
                fixed = (*self.backward.reads, *self.backward.writes, self.backward.counter)
                varying.update(r for k, r in enumerate(op.results) if k not in fixed)
            elif reads:
                varying.update(op.results)
        return varying, sums

    def _check_own_part(self, op: LocalSliceOp) -> None:
        if op.axis_names != (self.mb,):
            raise self.error(
                f"{op_name(op)} takes a device's part over {list(op.axis_names)}, the "
                "microbatch axis among them; Pipeline takes a microbatch's part alone"
            )

    def _own_parts(self, ops: Iterable[Operation], index: SSAValue | int) -> None:
        """Each `spmd.local_slice` over the microbatch axis among `ops` (and in
        their regions) takes microbatch `index`'s part (a constant, or the
        stage's microbatch of the time step) instead of a device's."""
        for top in list(ops):
            for op in list(top.walk()):
                if not isinstance(op, LocalSliceOp) or self.mb not in op.axis_names:
                    continue
                d = op.dim.value.data
                n = op.result.type.get_shape()[d]
                Rewriter.replace_op(op, [], [self.b.part(op.input, d, n, index, before=op)])

    def _is_varying(self, op: Operation) -> bool:
        return any(r in self.varying for r in op.results)

    def _after_sums(self, ops: list[Operation]) -> set[Operation]:
        """The ops that read a sum over microbatches (or the backward's
        accumulated gradients), directly or not."""
        tainted: set[SSAValue] = {s.results[0] for s in self.sums}
        tainted.update(self.backward.op.results[k] for k in self.partial_writes)
        after: set[Operation] = set()
        for op in ops:
            if op in self.sums or op is self.backward.op:
                continue
            if any(v in tainted for v in op.operands):
                after.add(op)
                tainted.update(op.results)
        return after

    # --- a stage's rows ----------------------------------------------------------------

    def _retype_stacked(self, invariant: Sequence[Operation]) -> None:
        """Values of the layer class keep a stage's rows; each op outside the
        loops on them is checked, and completed across stages, by its rule."""
        layer_dim = self.layer_dim = dict(self.loops.layer_dim)
        self.completions: dict[Operation, list[Operation]] = {}
        for arg in self.entry.body.block.args:
            if (d := layer_dim.get(arg)) is None:
                continue
            assert isinstance(arg.type, DTensorType)
            layers, axes = arg.type.global_type.get_shape()[d], arg.type.distribution.dims[d]
            parts = self.S * math.prod(self.mesh_size[a] for a in axes)
            if layers % parts:
                more = f" x {parts // self.S} parts over {', '.join(map(quoted, axes))}"
                raise self.error(
                    f"{layers} layers do not split over {self.S} stages{more if axes else ''}: "
                    "give the stack a layer count they divide"
                )
            layer_dim[Rewriter.replace_value_with_new_type(arg, self._staged(arg.type, d))] = d
        ops = [*self._to_locals(), *invariant]
        rules = {op: rule_for(op) for op in ops}  # read at the whole shapes, before any retype
        for op in ops:
            rule, plain = rules[op], not isinstance(op, CollectiveOp | ToLocalOp)
            if op.name == "stablehlo.reduce":
                self._reduce_across_stages(op, _reducer(op))
            elif rule is not None and plain:
                self._check_stage_rows(op, rule)
            layered = [(r, d) for r in op.results if (d := layer_dim.get(r)) is not None]
            if layered and rule is None and plain:
                raise self.error(
                    f"{op_name(op)} outside the layer loops has the layers in its shape, "
                    "and partir has no rule to give a stage its own part of it; read the "
                    "stacked values elementwise outside the loops"
                )
            for r, d in layered:
                if rule is not None and rule.localize is not None:  # sizes in its properties
                    factor = rule.result_factor(r.index, d)
                    assert factor is not None
                    op.properties.update(rule.localize(op, rule, factor, lambda n: n // self.S))
                ty = r.type
                assert isinstance(ty, TensorType)
                shape = list(ty.get_shape())
                shape[d] //= self.S
                retyped = TensorType(ty.get_element_type(), shape)
                layer_dim[Rewriter.replace_value_with_new_type(r, retyped)] = d

    def _check_stage_rows(self, op: Operation, rule: OpRule) -> None:
        """Whether a stage's rows of the layers run `op` as the whole does, by
        its rule: each factor over a layer dim tileable into the stages' parts
        (a sum factor completed across stages), and a value made along the
        layers the same on every row (a broadcast, a splat)."""
        layered = {
            f
            for j, v in enumerate(op.operands)
            if (d := self.layer_dim.get(v)) is not None
            and (f := rule.operand_factor(j, d)) is not None
        }
        made = {
            f
            for r in op.results
            if (d := self.layer_dim.get(r)) is not None
            and (f := rule.result_factor(r.index, d)) is not None
        } - layered
        for f in sorted(layered | made):
            why = rule.why_not_tileable(f, self.S)
            if why is not None:
                raise self.error(
                    f"{op_name(op)} outside the layer loops combines the layers of a stacked "
                    f"value ({why}); a stage holds only its own layers: compute it inside "
                    "the loop, or per layer"
                )
            if f in made and not (op.name == "stablehlo.broadcast_in_dim" or _is_splat(op)):
                raise self.error(
                    f"{op_name(op)} outside the layer loop makes a value along the layers "
                    "that differs per layer; a stage would make its own rows as the first "
                    "stage's: pass it in as an argument, or make it inside the loop"
                )
        if any(rule.factors[f].kind is FactorKind.SUM for f in layered):
            self._reduce_across_stages(op, "sum")

    def _reduce_across_stages(self, op: Operation, combiner: str | None) -> None:
        """A reduction over the layers is a stage's partial one: combine it."""
        if op.name == "stablehlo.reduce":
            d = self.layer_dim.get(op.operands[0])
            dims = op.properties.get("dimensions")
            if d is None or not isinstance(dims, DenseArrayBase) or d not in dims.get_values():
                return
        if combiner is None or len(op.results) != 1:
            raise self.error(
                f"{op_name(op)} reduces over the layers with a combiner other than a sum, "
                "max, min, and or or; a stage holds only its own layers"
            )
        result = op.results[0]
        ty = result.type
        assert isinstance(ty, TensorType)
        uses = list(result.uses)
        made: list[Operation] = []
        boolean = ty.get_element_type() == i1  # all / any: min / max of 0 and 1
        if boolean:
            as_int = TensorType(i32, ty.get_shape())
            made.append(shlo.ConvertOp.create(operands=[result], result_types=[as_int]))
        made.append(AllReduceOp((made[-1] if made else op).results[0], [self.axis], combiner))
        if boolean:
            made.append(shlo.ConvertOp.create(operands=[made[-1].results[0]], result_types=[ty]))
        Rewriter.insert_op(made, InsertPoint.after(op))
        self.completions[op] = made
        for use in uses:
            use.operation.operands[use.index] = made[-1].results[0]

    def _to_locals(self) -> list[Operation]:
        return [op for op in self.entry.body.block.ops if isinstance(op, ToLocalOp)]

    # --- building the schedule ---------------------------------------------------------

    def _build(self, block: Block, ops: list[Operation]) -> None:
        axes = {k: v for k, v in self.mesh_size.items() if k != self.mb}
        self.mesh = Mesh({self.axis: self.S, **axes} if self.axis not in axes else axes)
        new = Block(arg_types=[self._without_mb(a.type) for a in block.args])
        was: dict[SSAValue, Attribute] = {}
        for old, arg in zip(block.args, new.args, strict=True):
            arg.name_hint = old.name_hint
            was[arg] = old.type
            old.replace_all_uses_with(arg)
        b = self.b = Builder(new)
        # the arguments' parts: a microbatch's rows of each batch-split one
        self.per_mb: list[dict[SSAValue, SSAValue]] = [{} for _ in range(self.M)]
        for op in self._to_locals():
            op.detach()
            given, part, dist = op.operands[0].type, op.results[0].type, was[op.operands[0]]
            assert isinstance(given, DTensorType) and isinstance(dist, DTensorType)
            d = dist.distribution.split_dim_of(self.mb)
            if d is None:
                b.add(op)
                continue
            if dist.distribution.dims[d][-1] != self.mb:
                raise self.error("the microbatch axis must split the batch minor to the others")
            whole = b.add(ToLocalOp(op.operands[0], given.local_type(self.mesh)))
            whole.attributes[DIST] = given
            n = part.get_shape()[d]  # type: ignore[attr-defined]
            for m in range(self.M):
                self.per_mb[m][op.results[0]] = b.rows(whole.results[0], d, m * n, (m + 1) * n)
        self._move(self.before_ops)
        self.stage = b.add(AxisIndexOp([self.axis], TensorType(i32, []))).results[0]
        for m in range(self.M):
            self._own_parts(b.clone(self.pre, self.per_mb[m]), m)
        self._accumulate_pre_sums()
        self._run_schedule()
        self._finish_sums()
        self._move(self.after_ops)
        self._finish(block, new, ops)

    def _move(self, ops: Sequence[Operation]) -> None:
        """Move `ops` to the pipelined function, each with what completes it
        across stages (`_reduce_across_stages`)."""
        for op in ops:
            for moved in (op, *self.completions.get(op, ())):
                moved.detach()
                self.b.add(moved)

    def _without_mb(self, ty: Attribute) -> Attribute:
        return _without(ty, self.mb) if isinstance(ty, DTensorType) else ty

    def _staged(self, ty: DTensorType, layer_dim: int | None) -> DTensorType:
        """`ty` with its layers (dim `layer_dim`, if any) split over the stages, major."""
        if layer_dim is None:
            return ty
        dist = ty.distribution
        staged = dist.with_dim(layer_dim, (self.axis, *dist.dims[layer_dim]))
        return DTensorType.of(ty.global_type, staged)

    # --- the schedule --------------------------------------------------------------------

    def _flowing(self, loop: CountedLoop) -> list[int]:
        """The loop's per-microbatch carried values that change: the activation
        (the gradient) one stage hands the next."""
        returned = loop.op.body.block.last_op
        assert returned is not None
        return [
            k
            for k, v in enumerate(loop.op.operands)
            if k not in (*loop.reads, *loop.writes, loop.counter)
            and returned.operands[k] is not loop.op.body.block.args[k]
            and v in self.varying
        ]

    def _stack_pre_values(self) -> None:
        """Per pre value a layer loop reads, its microbatches stacked (a stage
        reads the one it works on)."""
        self.stacks: dict[SSAValue, SSAValue] = {}
        f_results = set(self.forward.op.results)
        for loop in (self.forward, self.backward):
            for k, v in enumerate(loop.op.operands):
                if v not in self.varying or v in f_results or v in self.stacks:
                    continue
                if loop is self.backward and k in self.flowing_b:
                    continue  # the head's seed, passed on by stages
                if v not in self.per_mb[0]:
                    raise self.error(
                        "a layer loop reads a per-microbatch value the step makes after the "
                        "first loop; Pipeline passes only the activation and its gradient "
                        "between stages"
                    )
                self.stacks[v] = self.b.stack([self.per_mb[m][v] for m in range(self.M)])

    def _run_schedule(self) -> None:
        b, f, bw, sched = self.b, self.forward, self.backward, self.schedule
        self.flowing_f, self.flowing_b = self._flowing(f), self._flowing(bw)
        needed = set(bw.op.operands)  # the forward results the backward reads: residuals
        self.residuals = [k for k, r in enumerate(f.op.results) if r in needed]
        for k in self.flowing_b:
            v = bw.op.operands[k]
            if not (isinstance(v.owner, Operation) and v.owner in self.head):
                raise self.error(
                    "the backward layer loop carries a per-microbatch value that does not "
                    "come from the head; Pipeline passes only the gradient of the loop's output"
                )
        self._stack_pre_values()
        self.head_sums = [s for s in self.sums if self._made_in(s.operands[0], self.head, f.op)]
        self.post_sums = [s for s in self.sums if self._made_in(s.operands[0], self.post, bw.op)]
        for op in self.post if self.post_sums else ():
            if any(isinstance(v.owner, Operation) and v.owner in self.head for v in op.operands):
                raise self.error(
                    f"{op_name(op)} after the backward loop reads a value of the head; "
                    "the head runs on the last stage and this op on the first"
                )
        self._deal_stacks()
        state: dict[Key, SSAValue] = {}
        self.state = state
        # a stage keeps each (chunk, microbatch) in its `sched.slot`, and has a
        # spare row for what it does not keep (`Builder.store`)
        buffers: list[tuple[Key, SSAValue]]
        buffers = [(("act", k), f.op.operands[k]) for k in self.flowing_f]
        for kind in ("grad", "seed"):
            buffers += [((kind, k), bw.op.operands[k]) for k in self.flowing_b]
        buffers += [(("res", j), f.op.results[j]) for j in self.residuals]
        self.row_types = {key: v.type for key, v in buffers}
        for key, v in buffers:
            state[key] = b.zeros(stacked(v.type, sched.slots + 1))
        self.writes = sorted(self.partial_writes)
        for k in self.writes:  # a stage's rows: its chunks' rows
            n, *rest = bw.op.results[k].type.get_shape()  # type: ignore[attr-defined]
            dtype = bw.op.results[k].type.get_element_type()  # type: ignore[attr-defined]
            state[("w", k)] = b.zeros(TensorType(dtype, [n * self.chunks, *rest]))
        for sm in (*self.head_sums, *self.post_sums):
            state[("sum", sm)] = b.zeros(sm.operands[0].type)
        self.first = b.cmp(self.stage, b.const(0), "EQ")
        self.last = b.cmp(self.stage, b.const(self.S - 1), "EQ")
        for t, row in enumerate(sched.table):
            self._time_step(row)
            self._send(sched.sends(t, "F"), self.flowing_f, "act")
            self._send(sched.sends(t, "B"), self.flowing_b, "grad")
        dealt = self._dealt([state[("w", k)] for k in self.writes], cyclic=False)
        self.grads = dict(zip(self.writes, dealt, strict=True))
        self.acc.update((sm, state[("sum", sm)]) for sm in (*self.head_sums, *self.post_sums))

    def _time_step(self, row: tuple[Action | None, ...]) -> None:
        """One `stablehlo.case` on the stage's action in `row`: idle, a forward
        (the last chunk's with the head) or a backward (the first chunk's with
        the ops after the loop); `state` updated, and the activations (the
        gradients) the step sends kept in `out` for `_send`.

        The buffers stay out of the case: a branch reads its slot and returns
        only what it made, which is kept after the case (a case threading
        every buffer makes XLA copy them all at every step); the running sums
        are added inside it (outside, XLA fuses the steps' additions into one
        that keeps every step's part alive). A phase no stage runs in `row`
        costs nothing."""
        b, f, bw, sched = self.b, self.forward.op, self.backward.op, self.schedule
        flowing_f, flowing_b, state = self.flowing_f, self.flowing_b, self.state

        def of_stage(cell: Callable[[int, Action], int]) -> SSAValue:
            cells = [0 if a is None else cell(s, a) for s, a in enumerate(row)]
            return b.of_stage(cells, self.stage)

        kind = of_stage(lambda s, a: 1 if a.phase == "F" else 2)
        m = of_stage(lambda s, a: a.microbatch)
        slot = of_stage(sched.slot)
        chunk = of_stage(lambda s, a: a.chunk) if self.chunks > 1 else None
        phases = {a.phase for a in row if a is not None}
        last, first = row[self.S - 1], row[0]
        head = last is not None and last.phase == "F" and last.chunk == self.chunks - 1
        post = first is not None and first.phase == "B" and first.chunk == 0 and self.post_sums
        keys: list[Key] = []
        if "F" in phases:
            keys += [("act", k) for k in flowing_f] + [("res", j) for j in self.residuals]
        if "B" in phases:
            keys += [("grad", k) for k in flowing_b] + [("w", k) for k in self.writes]
        if head:
            keys += [("seed", k) for k in flowing_b] + [("sum", sm) for sm in self.head_sums]
        if post:
            keys += [("sum", sm) for sm in self.post_sums]
        running = {k for k in keys if k[0] in ("w", "sum")}

        def made(values: dict[Key, SSAValue]) -> list[SSAValue]:
            """The branch's values in `keys` order: a running value with what
            the branch adds to it, zeros (a slot's) for one it does not make."""
            return [
                values.get(k, state[k]) if k in running
                else values[k] if k in values
                else b.zeros(self.row_types[k])
                for k in keys
            ]

        def forward() -> list[SSAValue]:
            received = {
                k: b.select(
                    self._on_chunk(self.first, chunk, 0),
                    b.load(self.stacks[f.operands[k]], m),
                    b.load(state[("act", k)], slot),
                )
                for k in flowing_f
            }
            clone = self._run_loop(self.forward, m, chunk, received)
            values: dict[Key, SSAValue] = {("act", k): clone.results[k] for k in flowing_f}
            values |= {("res", j): clone.results[j] for j in self.residuals}
            if head:
                assert last is not None
                values |= self._segment(
                    self.last, self.head, last.microbatch, f, clone, self.head_sums, flowing_b
                )
            return made(values)

        def backward() -> list[SSAValue]:
            f_results: dict[SSAValue, int] = {r: j for j, r in enumerate(f.results)}
            given = {
                k: b.load(state[("res", f_results[v])], slot)
                for k, v in enumerate(bw.operands)
                if v in f_results
            }
            for k in flowing_b:
                seed, got = b.load(state[("seed", k)], slot), b.load(state[("grad", k)], slot)
                given[k] = b.select(self._on_chunk(self.last, chunk, self.chunks - 1), seed, got)
            clone = self._run_loop(self.backward, m, chunk, given)
            values: dict[Key, SSAValue] = {("grad", k): clone.results[k] for k in flowing_b}
            for k in self.writes:
                w, dw = state[("w", k)], clone.results[k]
                values[("w", k)] = b.sum(w, dw) if chunk is None else b.add_rows(w, dw, chunk)
            if post:
                assert first is not None
                values |= self._segment(
                    self.first, self.post, first.microbatch, bw, clone, self.post_sums
                )
            return made(values)

        def idle() -> list[SSAValue]:
            return made({})

        branches = [idle, forward if "F" in phases else idle, backward if "B" in phases else idle]
        varying = [self._state_axes(k) for k in keys]
        out = dict(zip(keys, b.case(kind, branches, varying), strict=True))
        if "F" in phases:
            did_forward = b.cmp(kind, b.const(1), "EQ")
            for j in self.residuals:
                state[("res", j)] = b.store(state[("res", j)], out[("res", j)], slot, did_forward)
        state.update((k, out[k]) for k in running)
        if head:
            assert last is not None
            at = b.const(sched.slot(self.S - 1, last))
            for k in flowing_b:
                state[("seed", k)] = b.store(state[("seed", k)], out[("seed", k)], at, self.last)
        self.out = out

    # --- a stage's chunks (the interleaved schedule) -------------------------------------

    def _on_chunk(self, pred: SSAValue, chunk: SSAValue | None, at: int) -> SSAValue:
        """`pred` (the stage is the first, the last) and the action is on chunk `at`."""
        if chunk is None:
            return pred
        return self.b.and_(pred, self.b.cmp(chunk, self.b.const(at), "EQ"))

    def _deal_stacks(self) -> None:
        """Where a stage holds several chunks: its chunks of each stacked value
        the loops read, dealt to it from the stages' consecutive rows
        (`deal_chunks`), once a step; zeros need no dealing."""
        self.dealt: dict[SSAValue, SSAValue] = {}
        if self.chunks == 1:
            return
        stacks: list[SSAValue] = []
        for loop in (self.forward, self.backward):
            for k in sorted({*loop.reads, *loop.writes}):
                v = loop.op.operands[k]
                if v in stacks or v.owner is self.forward.op or _is_zeros(v):
                    continue
                ty = v.type
                assert isinstance(ty, TensorType)
                if v in self.varying or ty.get_shape()[0] != self.chunks * self.chunk_rows:
                    raise self.error(
                        f"the layer loop reads a stacked value of {ty.get_shape()[0]} rows per "
                        f"stage{' per microbatch' if v in self.varying else ''}; the interleaved "
                        f"schedule deals each stage its {self.chunks} chunks of "
                        f"{self.chunk_rows} layers of values split over the stage axis alone"
                    )
                stacks.append(v)
        self.dealt = dict(zip(stacks, self._dealt(stacks, cyclic=True), strict=True))

    def _dealt(self, values: list[SSAValue], cyclic: bool) -> list[SSAValue]:
        """`values`' chunks dealt to the interleaved schedule's stages (`cyclic`)
        or back to the stages' consecutive rows; as they are where a stage holds
        one chunk."""
        if self.chunks == 1 or not values:
            return values
        return deal_chunks(self.b, values, self.stage, self.axis, self.S, self.chunks, cyclic)

    def _run_loop(
        self, loop: CountedLoop, m: SSAValue, chunk: SSAValue | None, given: dict[int, SSAValue]
    ) -> Operation:
        """A stage's `loop` on microbatch `m` (and its `chunk`, if it holds
        several): the operands `given` by position, microbatch `m`'s part of
        each per-microbatch value it reads, the chunk's rows of a stacked one,
        the rest as they are."""
        b = self.b
        rows = {*loop.reads, *loop.writes}

        def operand(k: int, v: SSAValue) -> SSAValue:
            if k in given:
                return given[k]
            if v in self.varying:
                return b.load(self.stacks[v], m)
            if chunk is not None and k in rows:
                return b.rows_at(self.dealt.get(v, v), chunk, self.chunk_rows)
            return v

        operands = [operand(k, v) for k, v in enumerate(loop.op.operands)]
        clone = b.clone_loop(loop.op, operands, [self.axis])
        self._own_parts([clone], m)
        return clone

    def _send(self, sends: list[tuple[int, int, Action]], flowing: list[int], kind: str) -> None:
        """Hand each sender's value (the time step's `out`) to its neighbour,
        which keeps it in the slot of the action it is for."""
        if not sends:
            return
        b = self.b
        pairs = [(s, r) for s, r, _ in sends]
        arriving = [self.schedule.slots] * self.S  # who receives nothing writes the spare row
        for _, r, action in sends:
            arriving[r] = self.schedule.slot(r, action)
        index = b.of_stage(arriving, self.stage)
        for k in flowing:
            got = b.add(CollectivePermuteOp(self.out[(kind, k)], [self.axis], pairs)).results[0]
            self.state[(kind, k)] = b.put(self.state[(kind, k)], got, index)

    def _segment(
        self, on: SSAValue, ops: Sequence[Operation], m: int, loop: Operation, clone: Operation,
        sums: list[Operation], seeds: Sequence[int] = (),
    ) -> dict[Key, SSAValue]:
        """Where `on` holds (the last stage: the head; the first: the ops after
        the backward loop), `ops` on microbatch `m`, `loop`'s results as its
        `clone` made them: the backward's `seeds` (zeros elsewhere), and
        `sums` with the segment's share added."""
        b, bw, state = self.b, self.backward.op, self.state
        values = dict(self.per_mb[m])
        values.update(zip(loop.results, clone.results, strict=True))
        keys = [("seed", k) for k in seeds] + [("sum", s) for s in sums]

        def taken() -> list[SSAValue]:
            mapping = dict(values)
            self._own_parts(b.clone(ops, mapping), m)
            out = [mapping[bw.operands[k]] for k in seeds]
            return out + [
                b.sum(state[("sum", s)], mapping.get(s.operands[0], s.operands[0])) for s in sums
            ]

        def other() -> list[SSAValue]:
            zeros = [b.zeros(bw.operands[k].type) for k in seeds]
            return zeros + [state[("sum", s)] for s in sums]

        varying = [self._state_axes(k) for k in keys]
        return dict(zip(keys, b.case(on, [taken, other], varying, shlo.IfOp), strict=True))

    def _state_axes(self, key: Key) -> tuple[str, ...]:
        """The mesh axes a value the schedule keeps differs over: its own
        distribution's (without the microbatch axis), and the stage axis."""
        kind, at = key
        if isinstance(at, Operation):  # a running sum: its operand's distribution
            owner = at.operands[0].owner
            dist = owner.attributes.get(DIST) if isinstance(owner, Operation) else None
        else:  # a loop's carried value
            loop = self.forward.op if kind in ("act", "res") else self.backward.op
            carried = loop.attributes.get(CARRIED)
            dist = carried.data[at] if isinstance(carried, ArrayAttr) else None  # type: ignore[call-overload]
        axes = dist.distribution.axes if isinstance(dist, DTensorType) else ()
        return (*(a for a in axes if a != self.mb), self.axis)

    def _made_in(self, value: SSAValue, segment: list[Operation], loop: Operation) -> bool:
        owner = value.owner
        return owner is loop or (isinstance(owner, Operation) and owner in segment)

    # --- the sums over microbatches ------------------------------------------------------

    def _accumulate_pre_sums(self) -> None:
        """Sums of the pre ops' values: every stage makes them alike."""
        self.acc: dict[Operation, SSAValue] = {}
        for s in self.sums:
            if s.operands[0] in self.per_mb[0]:  # a pre op's value, or an argument's rows
                parts = [self.per_mb[m][s.operands[0]] for m in range(self.M)]
                self.acc[s] = functools.reduce(self.b.sum, parts, self.b.zeros(parts[0].type))

    def _finish_sums(self) -> None:
        for s in self.sums:
            assert isinstance(s, AllReduceOp)
            if s not in self.acc:
                raise self.error(f"{op_name(s)} over microbatches sums a value no stage makes")
            rest = [a for a in s.axis_names if a != self.mb]
            if s in (*self.head_sums, *self.post_sums):  # one stage made it
                rest = [self.axis, *rest]
            value = self.acc[s]
            if rest:
                reduced = AllReduceOp(value, rest)
                reduced.attributes.update({k: v for k, v in s.attributes.items() if k != DIST})
                value = self.b.add(reduced).results[0]
            s.results[0].replace_all_uses_with(value)
        for k, total in self.grads.items():
            if self.partial_writes[k]:
                total = self.b.add(AllReduceOp(total, self.partial_writes[k])).results[0]
            self.layer_dim[total] = 0  # its rows are the stage's layers (a step may return it)
            self.backward.op.results[k].replace_all_uses_with(total)
        for k in self.backward.reads:
            self.backward.op.results[k].replace_all_uses_with(self.backward.op.operands[k])

    # --- the function ------------------------------------------------------------------

    def _finish(self, block: Block, new: Block, ops: list[Operation]) -> None:
        b = self.b
        returned = ops[-1]
        for op in ops:
            if isinstance(op, FromLocalOp):
                value = op.operands[0]
                dtensor = op.results[0].type
                assert isinstance(dtensor, DTensorType)
                typed = self._staged(_without(dtensor, self.mb), self.layer_dim.get(value))
                made = b.add(FromLocalOp(value, typed))
                made.attributes[DIST] = typed
                op.results[0].replace_all_uses_with(made.results[0])
        results = list(returned.operands)
        b.add(func.ReturnOp(*results))
        for op in reversed(ops):
            if op.parent_block() is block:
                op.detach()
                op.erase(safe_erase=False)
        self.entry.body.detach_block(block)
        self.entry.body.add_block(new)
        self.entry.function_type = func.FunctionType.from_lists(
            [a.type for a in new.args], [v.type for v in results]
        )
        Rewriter.replace_op(module_mesh(self.module, "Pipeline"), self.mesh.to_op())
        for op in new.walk():
            _drop_axis(op, self.mb)


def _partial_carries(loop: Operation, partial: dict[int, tuple[str, ...]]) -> None:
    """The loop's carried values `partial` names are partial sums over those axes."""
    carried = loop.attributes.get(CARRIED)
    if not isinstance(carried, ArrayAttr) or not partial:
        return
    entries = list(carried.data)
    for k, axes in partial.items():
        t = entries[k]
        if isinstance(t, DTensorType):
            d = t.distribution
            entries[k] = DTensorType.of(t.global_type, Distribution(d.dims, (*d.partial, *axes)))
    loop.attributes[CARRIED] = ArrayAttr(entries)


def _without(ty: DTensorType, axis: str) -> DTensorType:
    return DTensorType.of(ty.global_type, ty.distribution.without([axis]))


def _drop_axis(op: Operation, axis: str) -> None:
    """`op`'s distribution annotations without `axis`."""
    dist = op.attributes.get(DIST)
    if isinstance(dist, DTensorType):
        op.attributes[DIST] = _without(dist, axis)
    carried = op.attributes.get(CARRIED)
    if isinstance(carried, ArrayAttr):
        op.attributes[CARRIED] = ArrayAttr(
            [_without(t, axis) if isinstance(t, DTensorType) else t for t in carried.data]
        )


def _is_zeros(value: SSAValue) -> bool:
    """A constant of zeros, through broadcasts and `spmd.to_local`."""
    while isinstance(op := value.owner, Operation) and op.name in _PASSING_ZEROS:
        value = op.operands[0]
    return constant_int(value) == 0


_PASSING_ZEROS = ("stablehlo.broadcast_in_dim", "spmd.to_local")


def _is_splat(op: Operation) -> bool:
    value = op.properties.get("value")
    return op.name == "stablehlo.constant" and len(set(value.get_values())) <= 1  # type: ignore[union-attr]


def _reducer(op: Operation) -> str | None:
    """A reducer's combiner, as the all-reduce that completes stages' partial
    reductions (booleans' and / or as min / max of 0 and 1)."""
    combiner = combiner_name(op.regions[0]) or ""
    return {**REDUCTIONS, "stablehlo.and": "min", "stablehlo.or": "max"}.get(combiner)
