"""The pipelined step: one SPMD program that runs a schedule inside `shard_map`.

Every device runs the same code; its stage is `axis_index(axis)`. The step's
segments (`partir.pipeline.structure`) run as follows:

- pre, and the head's ops that do not read the layer loop, on every device,
  on the whole batch (they are what the step computes before its loops);
- then one unrolled block per time step of the schedule: the stage looks
  up its action in the table (a constant indexed by its stage) and, under
  `lax.cond`, runs the forward loop on its layers for one microbatch (the
  microbatch trace's own `scan`) or the backward loop; then the step's
  activations go to the next stage and gradients to the previous one, each
  by one `lax.ppermute` whose pairs are exactly the stages that sent
  something at that step (so a run moves 2 x (stages - 1) x microbatches
  microbatch tensors on the stage axis, none in the bubble);
- a stage keeps each microbatch it holds in slot `m % slots` of its
  buffers (received activation, the forward's residuals, received
  gradient): `Schedule.slots` is every microbatch under GPipe, about
  `stages` under 1F1B, which is where 1F1B saves memory;
- the last stage turns a microbatch's output into the backward's input
  with the head run on its rows (the head treats examples apart, as
  microbatching itself assumes: the gradient of rows depends on those
  rows alone, which `find_structure` checks), and at the end runs the
  head once on the whole output,
  for the loss and the gradients of the parameters after the loop; the
  values the update reads from it go to every stage;
- the backward's gradients of stacked leaves add up over microbatches on
  each stage (and over data-parallel shards); the update then runs on
  each stage's own layers.

With a data-parallel axis each shard runs the loops on its rows of every
microbatch; pre, head and update run on the whole batch, gathered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import DropVar, JaxprEqn, Var

from dialects.errors import UnsupportedError
from partir.pipeline.equations import (
    Env,
    inputs_of,
    read_atom,
    read_atoms,
    run_eqn,
    run_eqns,
)
from partir.pipeline.schedule import Schedule
from partir.pipeline.structure import StepStructure

if TYPE_CHECKING:
    from partir.pipeline.megatron import StageSegments

IDLE, FORWARD, BACKWARD = 0, 1, 2


def zeros_of(var: Any) -> Any:
    """Zeros shaped like a jaxpr variable."""
    aval: Any = var.aval
    return jnp.zeros(aval.shape, aval.dtype)


def _dtype(var: Any) -> Any:
    return var.aval.dtype


def across(value: Any, combine: str, axes: tuple[str, ...]) -> Any:
    """`value`, each device's partial reduction, combined over `axes` ("sum",
    "max" or "min"; a boolean's and/or as min/max of 0 and 1)."""
    if value.dtype == jnp.bool_:
        return across(value.astype(jnp.int32), combine, axes).astype(jnp.bool_)
    reduce = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[combine]
    return reduce(value, axes)


def _needed(eqns: list[JaxprEqn], targets: set[Any]) -> list[JaxprEqn]:
    """The equations `targets` depend on, in order."""
    wanted, chosen = set(targets), []
    for eqn in reversed(eqns):
        if wanted & set(eqn.outvars):
            chosen.append(eqn)
            wanted |= {v for v in eqn.invars if isinstance(v, Var)}
    return chosen[::-1]


@dataclass(frozen=True)
class Layout:
    """Which operand of the backward loop comes from where."""

    source: dict[int, tuple[str, int]]
    """operand index -> ("residual", forward result index) | ("gradient", flowing index)
    | ("env", -1)."""
    flowing: tuple[int, ...]
    """Carry positions (0-based among the carries) of the gradient passed between stages."""
    late: tuple[JaxprEqn, ...]
    """The head's ops that read the forward loop's results."""
    early: tuple[JaxprEqn, ...]


def backward_layout(s: StepStructure) -> Layout:
    """Sort the backward loop's operands, or refuse a step whose head feeds the
    backward anything but the gradient of the loop's output."""
    jaxpr = s.local.jaxpr
    fwd, bwd = s.forward_eqn, s.backward_eqn
    late_at, early_at = s.head_split()
    late = [jaxpr.eqns[i] for i in late_at]
    early = [jaxpr.eqns[i] for i in early_at]
    tainted = set(fwd.outvars).union(*(eqn.outvars for eqn in late))
    results = {v: i for i, v in enumerate(fwd.outvars)}
    carries = s.carries(bwd)
    source: dict[int, tuple[str, int]] = {}
    flowing: list[int] = []
    for k, var in enumerate(bwd.invars):
        if isinstance(var, Var) and var in results:
            source[k] = ("residual", results[var])
        elif isinstance(var, Var) and var in tainted:
            if k not in carries or (s.backward, k) not in s.operand_batch_dim:
                aval: Any = var.aval
                raise UnsupportedError(
                    "Pipeline: the backward layer loop reads a value of the head "
                    f"(shape {tuple(aval.shape)}) other than the gradient of the loop's "
                    "output; Pipeline needs the head to read only the loop's final carry"
                )
            source[k] = ("gradient", len(flowing))
            flowing.append(k - carries.start)
        else:
            if k in carries and (s.backward, k) in s.operand_batch_dim:
                raise UnsupportedError(
                    "Pipeline: the backward layer loop carries a per-example value that "
                    "does not come from the head; Pipeline supports loops whose only "
                    "per-example carry is the activation"
                )
            source[k] = ("env", -1)
    used_later = _used_after(s)
    for _i, var in enumerate(fwd.outvars[fwd.params["num_carry"] :]):
        if var in used_later:
            raise UnsupportedError(
                "Pipeline: the step reads the layer loop's per-layer outputs (scan ys) "
                "outside the backward loop; return only the carry from the scan"
            )
    return Layout(source, tuple(flowing), tuple(late), tuple(early))


def _used_after(s: StepStructure) -> set[Any]:
    jaxpr = s.local.jaxpr
    used = {v for v in jaxpr.outvars if isinstance(v, Var)}
    for eqn in jaxpr.eqns[s.backward + 1 :]:
        used |= {v for v in eqn.invars if isinstance(v, Var)}
    return used


def handed_to_update(s: StepStructure) -> set[Any]:
    """The head's values the update (or the step's results) reads: the last stage
    computes them, and every stage gets them (one all-reduce on the stage axis)."""
    made = {v for eqn in s.local.jaxpr.eqns[s.forward + 1 : s.backward] for v in eqn.outvars}
    made |= set(s.forward_eqn.outvars[: s.forward_eqn.params["num_carry"]])
    return made & _used_after(s)


@dataclass(frozen=True)
class PipelineProgram:
    """What the shard_map body needs: the step's structure, the schedule, the axes."""

    structure: StepStructure
    schedule: Schedule
    axis: str
    data_axis: str | None
    data_parts: int
    zero: int = 0
    """The ZeRO stage over `data_axis` (0: none): each data shard holds and
    updates its share of the stage's layers' optimizer state (1), returns only
    its share of the updated layers (2), and holds only its share of the
    parameters, gathered once per step for the loops (3)."""
    segments: StageSegments | None = None
    """With Megatron: the loops and the update, partitioned over its axis."""

    def body(self) -> Callable[..., list[Any]]:
        return _Body(self, backward_layout(self.structure)).run


class _Body:
    def __init__(self, program: PipelineProgram, layout: Layout):
        self.p, self.s, self.layout = program, program.structure, layout
        self.sched = program.schedule
        self.fwd, self.bwd = self.s.forward_eqn, self.s.backward_eqn
        self.mfwd, self.mbwd = self.s.micro_forward, self.s.micro_backward
        self.fwd_carries = list(self.s.carries(self.fwd))
        self.n_fcarry = self.fwd.params["num_carry"]
        self.n_bcarry = self.bwd.params["num_carry"]
        self.local_rows = self.s.batch // program.data_parts
        self.used_later = _used_after(self.s)

    # --- rows -----------------------------------------------------------------
    def rows(self, value: Any, dim: int, m: Any) -> Any:
        start = self.shard * self.local_rows + m * self.s.micro_rows
        return lax.dynamic_slice_in_dim(value, start, self.s.micro_rows, dim)

    def local_buffer(self, var: Any, dim: int) -> Any:
        shape = list(var.aval.shape)
        shape[dim] = self.local_rows
        return jnp.zeros(shape, var.aval.dtype)

    def gather(self, value: Any, dim: int) -> Any:
        if self.p.data_axis is None:
            return value
        return lax.all_gather(value, self.p.data_axis, axis=dim, tiled=True)

    def from_stage(self, value: Any, stage: int) -> Any:
        """`value` as stage `stage` holds it, on every stage."""
        kept = jnp.where(self.stage == stage, value, jnp.zeros_like(value))
        return lax.psum(kept, self.p.axis)

    # --- the step ---------------------------------------------------------------
    def run(self, *leaves: Any) -> list[Any]:
        jaxpr = self.s.local.jaxpr
        self.stage = lax.axis_index(self.p.axis)
        self.shard = lax.axis_index(self.p.data_axis) if self.p.data_axis else 0
        env: Env = dict(zip(jaxpr.constvars, self.s.local.consts, strict=True))
        env.update(zip(jaxpr.invars, leaves, strict=True))
        if self.p.zero == 3:  # each data shard holds its share: the loops need them all
            assert self.p.data_axis is not None
            for i in set(self.s.stacked) - set(self.s.optimizer_state):
                var = jaxpr.invars[i]
                env[var] = lax.all_gather(env[var], self.p.data_axis, axis=0, tiled=True)
        run_eqns(jaxpr.eqns[: self.s.forward], env)
        run_eqns(list(self.layout.early), env)
        self.env = env
        state = self.initial_state()
        for t in range(self.sched.steps):
            state = self.time_step(t, state)
        self.finish(state, env)
        if self.p.zero:
            return self.sharded_update(env)
        if self.p.segments is not None:
            update = self.p.segments.update
            return update(read_atoms(env, self.p.segments.update_inputs))
        self.run_update(jaxpr.eqns[self.s.backward + 1 :], env, (self.p.axis,))
        return read_atoms(env, jaxpr.outvars)

    def run_update(self, eqns: Sequence[JaxprEqn], env: Env, axes: tuple[str, ...]) -> None:
        """The update's equations on this device's layers. A reduction over the
        layers of a stacked value (`StepStructure.across_layers`: a global
        gradient norm) reduces only those, so its result is completed across
        `axes`, the axes the layers are split over."""

        def run(i: int, eqn: JaxprEqn, operands: list[Any]) -> list[Any]:
            outs = run_eqn(eqn, operands)
            combine = self.s.across_layers.get(i)
            return outs if combine is None else [across(x, combine, axes) for x in outs]

        run_eqns(eqns, env, run, first=self.s.backward + 1)

    def sharded_update(self, env: Env) -> list[Any]:
        """ZeRO: the update on this data shard's share of the stage's layers
        (the `zero` trace's update: its optimizer state is that share, its
        gradients were reduce-scattered to it, its parameters are cut to it;
        with Megatron, partitioned over the model axis too), and at ZeRO
        stage 1 the stacked results gathered back over the data axis."""
        zero, data_axis, segments = self.s.zero, self.p.data_axis, self.p.segments
        assert zero is not None and data_axis is not None
        update = zero.jaxpr.eqns[self.s.backward + 1 :]
        stands_for = self.s.zero_vars()
        zenv: Env = dict(zip(zero.jaxpr.constvars, zero.consts, strict=True))
        inputs = inputs_of(update, zero.jaxpr.outvars)
        model_dims = segments.update.operand_dims if segments else (None,) * len(inputs)
        for var, model_dim in zip(inputs, model_dims, strict=True):
            if var in zenv:
                continue
            value = env[stands_for[var]]
            shape = self.part_shape(var, model_dim)
            cut = [d for d, (a, b) in enumerate(zip(value.shape, shape, strict=True)) if a != b]
            if len(cut) > 1:
                raise UnsupportedError(
                    "Pipeline with ZeRO: the update reads a value whose layers are not on "
                    f"one dim (shape {tuple(value.shape)} for a share of {shape}); ZeRO beside "
                    "a Pipeline needs the update to keep each layer's values apart"
                )
            for d in cut:  # the layer dim of a stacked value: this shard's share of it
                value = lax.dynamic_slice_in_dim(value, self.shard * shape[d], shape[d], d)
            zenv[var] = value
        if segments is not None:
            results = segments.update(read_atoms(zenv, segments.update_inputs))
        else:
            self.run_update(update, zenv, (self.p.axis, data_axis))
            results = read_atoms(zenv, zero.jaxpr.outvars)
        if self.p.zero >= 2:  # the updated layers stay split, as the specs say
            return results
        return [
            lax.all_gather(r, data_axis, axis=0, tiled=True) if i in self.s.stacked_results else r
            for i, r in enumerate(results)
        ]

    def initial_state(self) -> dict[str, list[Any]]:
        slots = self.sched.slots

        def ring(var: Any, dim: int | None = None) -> Any:
            return jnp.zeros((slots, *self.part_shape(var, dim)), var.aval.dtype)

        fwd_dims = [self.s.result_batch_dim[(self.s.forward, j)] for j in range(self.n_fcarry)]
        return {
            "act": [ring(self.mfwd.invars[k]) for k in self.fwd_carries],
            "res": [
                ring(v, self.result_dim("forward", k)) for k, v in enumerate(self.mfwd.outvars)
            ],
            "grad": [
                ring(self.mbwd.invars[self.bwd.params["num_consts"] + j])
                for j in self.layout.flowing
            ],
            "out": [
                self.local_buffer(self.fwd.outvars[j], fwd_dims[j]) for j in range(self.n_fcarry)
            ],
            "first": [
                self.local_buffer(self.bwd.outvars[j], self._bwd_dim(j))
                for j in self.layout.flowing
            ],
            "acc": [
                jnp.zeros(self.part_shape(v, self.result_dim("backward", k)), _dtype(v))
                for k, v in enumerate(self.mbwd.outvars)
            ],
        }

    def result_dim(self, loop: str, k: int) -> int | None:
        """The dim of the loop's result `k` split over the model axis (Megatron)."""
        segments = self.p.segments
        if segments is None:
            return None
        return (segments.forward if loop == "forward" else segments.backward).result_dims[k]

    def part_shape(self, var: Any, dim: int | None) -> tuple[int, ...]:
        """`var`'s shape, with `dim` cut to one model shard's part."""
        shape = list(var.aval.shape)
        if dim is not None:
            assert self.p.segments is not None
            shape[dim] //= self.p.segments.parts
        return tuple(shape)

    def _bwd_dim(self, j: int) -> int:
        return self.s.result_batch_dim[(self.s.backward, j)]

    def time_step(self, t: int, state: dict[str, list[Any]]) -> dict[str, list[Any]]:
        row = self.sched.table[t]
        kinds = np.array(
            [IDLE if a is None else FORWARD if a.phase == "F" else BACKWARD for a in row], np.int32
        )
        micro = np.array([a.microbatch if a else 0 for a in row], np.int32)
        kind, m = jnp.asarray(kinds)[self.stage], jnp.asarray(micro)[self.stage]
        sent_f: list[Any] = []
        sent_b: list[Any] = []
        if (kinds == FORWARD).any():
            state, sent_f = lax.cond(kind == FORWARD, self.forward, self.skip_forward, state, m)
        if (kinds == BACKWARD).any():
            state, sent_b = lax.cond(kind == BACKWARD, self.backward, self.skip_backward, state, m)
        state = self.deliver(state, sent_f, self.sched.forward_sends(t), "act")
        return self.deliver(state, sent_b, self.sched.backward_sends(t), "grad")

    def deliver(
        self,
        state: dict[str, list[Any]],
        sent: list[Any],
        sends: list[tuple[int, int, int]],
        buffer: str,
    ) -> dict[str, list[Any]]:
        """ppermute what each sender sent; each receiver keeps it in its slot."""
        if not sends:
            return state
        perm = [(a, b) for a, b, _ in sends]
        received = [lax.ppermute(x, self.p.axis, perm) for x in sent]
        of = np.full(self.sched.stages, -1, np.int32)
        for _, b, m in sends:
            of[b] = m
        receiver_m = jnp.asarray(of)[self.stage]

        def keep(state: dict[str, list[Any]], m: Any) -> dict[str, list[Any]]:
            slot = m % self.sched.slots
            ring = [
                lax.dynamic_update_index_in_dim(r, x, slot, 0)
                for r, x in zip(state[buffer], received, strict=True)
            ]
            return {**state, buffer: ring}

        return lax.cond(receiver_m >= 0, keep, lambda state, m: state, state, receiver_m)

    # --- actions --------------------------------------------------------------------
    def forward(
        self, state: dict[str, list[Any]], m: Any
    ) -> tuple[dict[str, list[Any]], list[Any]]:
        slot = m % self.sched.slots
        operands = []
        for k, var in enumerate(self.fwd.invars):
            dim = self.s.operand_batch_dim.get((self.s.forward, k))
            if k in self.fwd_carries:
                assert dim is not None  # `find_structure` checked every carry has one
                first = self.rows(read_atom(self.env, var), dim, m)
                held = state["act"][self.fwd_carries.index(k)][slot]
                operands.append(jnp.where(self.stage == 0, first, held))
            elif dim is not None:
                operands.append(self.rows(read_atom(self.env, var), dim, m))
            else:
                operands.append(read_atom(self.env, var))
        segments = self.p.segments
        outs = segments.forward(operands) if segments else run_eqn(self.mfwd, operands)
        res = [
            lax.dynamic_update_index_in_dim(r, x, slot, 0)
            for r, x in zip(state["res"], outs, strict=True)
        ]
        last = self.stage == self.sched.stages - 1
        out = []
        for j, buf in enumerate(state["out"]):
            dim = self.s.result_batch_dim[(self.s.forward, j)]
            put = lax.dynamic_update_slice_in_dim(buf, outs[j], m * self.s.micro_rows, dim)
            out.append(jnp.where(last, put, buf))
        return {**state, "res": res, "out": out}, outs[: self.n_fcarry]

    def skip_forward(
        self, state: dict[str, list[Any]], m: Any
    ) -> tuple[dict[str, list[Any]], list[Any]]:
        del m
        return state, [zeros_of(v) for v in self.mfwd.outvars[: self.n_fcarry]]

    def head_gradient(self, state: dict[str, list[Any]], m: Any) -> list[Any]:
        """The gradient of the loop's output on microbatch `m`'s rows: the head run on
        the output so far, this shard's rows in place (the others zero)."""
        env = dict(self.env)
        for j, buf in enumerate(state["out"]):
            var = self.fwd.outvars[j]
            dim = self.s.result_batch_dim[(self.s.forward, j)]
            whole = zeros_of(var)
            env[var] = lax.dynamic_update_slice_in_dim(
                whole, buf, self.shard * self.local_rows, dim
            )
        wanted = [k for k, (kind, _) in self.layout.source.items() if kind == "gradient"]
        targets = {self.bwd.invars[k] for k in wanted}
        run_eqns(_needed(list(self.layout.late), targets), env)
        return [
            self.rows(env[self.bwd.invars[k]], self.s.operand_batch_dim[(self.s.backward, k)], m)
            for k in wanted
        ]

    def backward(
        self, state: dict[str, list[Any]], m: Any
    ) -> tuple[dict[str, list[Any]], list[Any]]:
        slot = m % self.sched.slots
        last = self.stage == self.sched.stages - 1
        held = [g[slot] for g in state["grad"]]
        incoming = lax.cond(last, self.head_gradient, lambda state, m: held, state, m)
        operands = []
        for k, var in enumerate(self.bwd.invars):
            kind, index = self.layout.source[k]
            if kind == "residual":
                operands.append(state["res"][index][slot])
            elif kind == "gradient":
                operands.append(incoming[index])
            else:
                dim = self.s.operand_batch_dim.get((self.s.backward, k))
                value = read_atom(self.env, var)
                operands.append(value if dim is None else self.rows(value, dim, m))
        segments = self.p.segments
        outs = segments.backward(operands) if segments else run_eqn(self.mbwd, operands)
        consts = self.bwd.params["num_consts"]
        acc = list(state["acc"])
        for j, value in enumerate(outs):
            if j in self.layout.flowing:
                continue
            if j < self.n_bcarry:
                value = value - operands[consts + j]
            acc[j] = acc[j] + value
        first = []
        for i, j in enumerate(self.layout.flowing):
            put = lax.dynamic_update_slice_in_dim(
                state["first"][i], outs[j], m * self.s.micro_rows, self._bwd_dim(j)
            )
            first.append(jnp.where(self.stage == 0, put, state["first"][i]))
        return {**state, "acc": acc, "first": first}, [outs[j] for j in self.layout.flowing]

    def skip_backward(
        self, state: dict[str, list[Any]], m: Any
    ) -> tuple[dict[str, list[Any]], list[Any]]:
        del m
        return state, [zeros_of(self.mbwd.outvars[j]) for j in self.layout.flowing]

    # --- after the schedule ------------------------------------------------------------
    def finish(self, state: dict[str, list[Any]], env: Env) -> None:
        last = self.sched.stages - 1
        for j, buf in enumerate(state["out"]):
            env[self.fwd.outvars[j]] = self.gather(
                buf, self.s.result_batch_dim[(self.s.forward, j)]
            )
        run_eqns(list(self.layout.late), env)
        for var in handed_to_update(self.s):
            env[var] = self.from_stage(env[var], last)
        consts = self.bwd.params["num_consts"]
        for j, var in enumerate(self.bwd.outvars):
            if isinstance(var, DropVar) or var not in self.used_later:
                continue
            if j in self.layout.flowing:
                i = self.layout.flowing.index(j)
                env[var] = self.from_stage(self.gather(state["first"][i], self._bwd_dim(j)), 0)
                continue
            if (self.s.backward, j) in self.s.result_batch_dim:
                raise UnsupportedError(
                    "Pipeline: the step reads a per-example gradient of the layer loop's "
                    "per-layer inputs; Pipeline supports per-layer inputs without a batch dim"
                )
            total = state["acc"][j]
            if self.p.zero and j >= self.n_bcarry:  # a stacked gradient: this shard's share
                assert self.p.data_axis is not None
                total = lax.psum_scatter(total, self.p.data_axis, scatter_dimension=0, tiled=True)
            elif self.p.data_axis is not None:
                total = lax.psum(total, self.p.data_axis)
            if j < self.n_bcarry:
                # a gradient of a value every layer reads: each stage's layers add to it
                init = read_atom(env, self.bwd.invars[consts + j])
                total = lax.psum(total, self.p.axis) + init
            env[var] = total
