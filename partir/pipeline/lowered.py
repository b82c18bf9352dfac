"""A pipelined step, lowered: its structure, schedule, program and report.

What `partir.jit(...).lower(*args)` returns when the tactics hold a
`Pipeline` (`engine="jaxpr"`): the same questions as `partir.lowered.Lowered`
(compile it, report it, estimate it), answered for a program built from the
step's jaxpr. Its estimate, report and ONNX export are below, this engine's
alone (the IR engine's are the `Lowered`'s: `partir.cost.estimate`,
`partir.report.pipeline`, `partir.onnx_interop.pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import ClosedJaxpr, JaxprEqn, jaxpr_as_fun
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from xdsl.dialects.builtin import TensorType, f32

from dialects.distribution import Distribution
from dialects.errors import PartirValueError
from dialects.escaping import quoted
from dialects.functions import entry_function
from dialects.locations import source_location
from partir.cost.collective_costs import collective_seconds
from partir.cost.profile import Profile
from partir.generated_files import write_private
from partir.importer import import_lowered, name_arguments, name_results, result_paths
from partir.mesh import Mesh
from partir.pipeline.engine import PipelineProgram, backward_layout
from partir.pipeline.equations import eqn_function, run_eqn, run_jaxpr
from partir.pipeline.megatron import Segment, StageSegments, stage_segments
from partir.pipeline.schedule import Schedule, make_schedule
from partir.pipeline.structure import (
    PipelineError,
    StepStructure,
    avals_bytes,
    find_structure,
    mirrored_params,
)
from partir.pipeline.tactic import Pipeline
from partir.plan import Leaf, ProgramView
from partir.report.render import Table, render_plain
from partir.selectors import display_path
from partir.simulation import simulate
from partir.tactics import ManualPartition, Megatron, Tactic


@dataclass
class PipelinedCompiled:
    """The pipelined step, jitted for one argument signature."""

    run: Callable[..., Any]
    out_tree: Any
    in_shardings: list[NamedSharding]

    def __call__(self, *args: Any) -> Any:
        leaves = place(jax.tree_util.tree_leaves(tuple(args)), self.in_shardings)
        return jax.tree_util.tree_unflatten(self.out_tree, list(self.run(*leaves)))


def _spec(layer_axes: Any, model_dim: int | None, segments: Any) -> P:
    """A leaf's spec: dim 0 over `layer_axes` (the stage axis, or with ZeRO's
    share the stage and data axes; None: whole), `model_dim` over the model
    axis (if any)."""
    entries: list[Any] = [layer_axes]
    if model_dim is not None:
        entries += [None] * (model_dim + 1 - len(entries))
        entries[model_dim] = segments.axis
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def place(leaves: Sequence[Any], shardings: Sequence[NamedSharding]) -> list[Any]:
    """Host values as global arrays: each process supplies its devices' parts of
    the same values (one process, or several under `jax.distributed`)."""
    placed = []
    for x, sharding in zip(leaves, shardings, strict=True):
        if isinstance(x, jax.Array) and x.sharding == sharding:
            placed.append(x)
            continue
        placed.append(_global(np.asarray(x), sharding))
    return placed


def _global(host: np.ndarray, sharding: NamedSharding) -> Any:
    return jax.make_array_from_callback(host.shape, sharding, host.__getitem__)


@dataclass
class PipelinedLowered:
    """Every part of one pipelined step, without running it."""

    tactic: Pipeline
    mesh: Mesh
    jax_mesh: jax.sharding.Mesh
    structure: StepStructure
    schedule: Schedule
    program: PipelineProgram
    out_tree: Any
    _compiled: PipelinedCompiled | None = field(default=None, repr=False)

    @property
    def in_specs(self) -> list[P]:
        """Stacked leaves split over the stage axis on their layer dim; with
        ZeRO, the optimizer state's split again over the data axis; with
        Megatron, the leaves it splits over the model axis too."""
        s, axis = self.structure, self.tactic.axis
        sharded = s.zero_split(self.program.zero)
        segments = self.program.segments
        model = segments.leaf_dims if segments is not None else {}
        split = (axis, self.program.data_axis)
        return [
            _spec(split if i in sharded else axis, model.get(i), segments) if i in s.stacked
            else P()
            for i in range(len(s.arg_names))
        ]

    @property
    def out_specs(self) -> list[P]:
        count = len(self.structure.local.jaxpr.outvars)
        segments = self.program.segments
        dims = segments.update.result_dims if segments is not None else (None,) * count
        layer_axes = (
            (self.tactic.axis, self.program.data_axis) if self.program.zero >= 2
            else self.tactic.axis
        )
        return [
            _spec(layer_axes if i in self.structure.stacked_results else None, dims[i], segments)
            for i in range(count)
        ]

    def function(self) -> Any:
        """The jitted SPMD program on the flat argument leaves."""
        body = jax.shard_map(
            self.program.body(),
            mesh=self.jax_mesh,
            in_specs=tuple(self.in_specs),
            out_specs=self.out_specs,
            check_vma=False,
        )
        return jax.jit(body)

    def compile(self) -> PipelinedCompiled:
        if self._compiled is None:
            shardings = [NamedSharding(self.jax_mesh, spec) for spec in self.in_specs]
            self._compiled = PipelinedCompiled(self.function(), self.out_tree, shardings)
        return self._compiled

    def executable(self, *args: Any) -> tuple[Any, list[Any]]:
        """XLA's executable of the step at `args` and the argument leaves placed
        for it: `exe(*leaves)` runs it, `exe.as_text()` is its optimized HLO (its
        collectives), `exe.memory_analysis()` its buffers."""
        leaves = jax.tree_util.tree_leaves(tuple(args))
        shardings = [NamedSharding(self.jax_mesh, spec) for spec in self.in_specs]
        placed = place(leaves, shardings)
        return self.function().lower(*placed).compile(), placed

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        """The step's results as its pytree, from the executable's flat results."""
        return jax.tree_util.tree_unflatten(self.out_tree, list(leaves))

    def report(self, profile: Profile | str | None = None) -> PipelineReport:
        """The schedule's timeline, the transfers on the stage axis, the buffers
        per stage; with `profile`, the predicted step (`estimate`)."""
        chosen = Profile.load(profile) if isinstance(profile, str) else profile
        return PipelineReport(
            self.tactic,
            self.schedule,
            self.structure,
            tuple(self.in_specs),
            self.estimate(chosen) if chosen is not None else None,
        )

    def to_onnx(self, path: str | Path | None = None) -> Any:
        """The step as an ONNX model (`onnx.ModelProto`) whose nodes carry the
        stage each runs on, the ONNX multi-device proposal's `pipeline_stage`
        (`partir.onnx_interop.pipeline`); written to `path` (0600) if given.
        Needs the `onnx` extra (`pip install 'partir[onnx]'`)."""
        model = _export_pipelined(
            self.structure, self.schedule, self.tactic.axis, self.out_tree, self.mesh
        )
        if path is not None:
            write_private(Path(path), model.SerializeToString())
        return model

    def estimate(self, profile: Profile | str) -> PipelineEstimate:
        chosen = profile if isinstance(profile, Profile) else Profile.load(profile)
        return estimate_pipeline(
            self.structure,
            self.schedule,
            self.tactic.axis,
            self.program.data_axis,
            self.mesh,
            chosen,
            self.program.zero,
            self.program.segments,
        )


def _megatron_dims(structure: StepStructure, megatron: Megatron, mesh: Mesh) -> dict[int, int]:
    """Each stacked leaf Megatron splits, by the dim it splits (its plan on the
    step's arguments), and the optimizer state mirroring it on the same dim."""
    shapes = [tuple(v.aval.shape) for v in structure.full.jaxpr.invars]
    view = ProgramView(
        tuple(
            Leaf("argument", i, name, TensorType(f32, shapes[i]))
            for i, name in enumerate(structure.arg_names)
        ),
        (),
    )
    dims = {
        t.leaf.index: t.dim
        for t in megatron.plan(view, mesh)
        if isinstance(t.leaf, Leaf) and t.leaf.index in structure.stacked
    }
    if not dims:
        raise PipelineError(
            f"Pipeline with {megatron!r}: Megatron selects none of the layer loop's stacked "
            "parameters; name them as Megatron's column= and row= say"
        )
    for mirror, param in mirrored_params(set(dims), structure.arg_names, shapes).items():
        dims[mirror] = dims[param]
    return dims


def lower_pipeline(
    fn: Callable[..., Any],
    args: Sequence[Any],
    mesh: Mesh,
    tactics: Sequence[Tactic],
    jax_mesh: jax.sharding.Mesh,
) -> PipelinedLowered:
    """Split `fn`'s step over the `Pipeline` tactic's axis (see `partir.pipeline`)."""
    pipelines = [t for t in tactics if isinstance(t, Pipeline)]
    tactic = pipelines[0]
    beside = tactic.check(mesh, [t for t in tactics if t is not tactic])
    stages, data_axis, parts, zero = (
        beside.stages, beside.data_axis, beside.data_parts, beside.zero
    )
    if any(
        not hasattr(x, "shape") and not isinstance(x, int | float)
        for x in jax.tree_util.tree_leaves(tuple(args))
    ):
        raise PartirValueError("Pipeline: every argument leaf must be an array")
    structure = find_structure(
        fn,
        args,
        stages=stages,
        microbatches=tactic.microbatches,
        data_parts=parts,
        stacked=tactic.stacked,
        axis=tactic.axis,
        zero_parts=parts if zero else 1,
    )
    schedule = make_schedule(tactic.schedule, stages, tactic.microbatches)
    segments = None
    if beside.megatron is not None:
        dims = _megatron_dims(structure, beside.megatron, mesh)
        segments = stage_segments(
            structure, backward_layout(structure).source, dims, beside.megatron.axis,
            beside.model_parts,
        )
    program = PipelineProgram(
        structure, schedule, tactic.axis, data_axis, parts, zero, segments
    )
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))
    return PipelinedLowered(tactic, mesh, jax_mesh, structure, schedule, program, out_tree)


# --- this engine's estimate (`PipelinedLowered.estimate`) ----------------------------


@dataclass(frozen=True)
class PipelineEstimate:
    """A pipelined step predicted on one profile (per device)."""

    profile: str
    schedule: str
    stages: int
    microbatches: int
    steps: int
    forward_seconds: float
    """One stage's forward loop on one microbatch."""
    backward_seconds: float
    other_seconds: float
    """The step outside the loops on one stage (head, update of its layers)."""
    permute_seconds: float
    """All the collective permutes of one step on the stage axis."""
    data_seconds: float
    """The gradient all-reduce over the data-parallel axis."""
    activation_bytes: int
    """The buffers a stage holds for its in-flight microbatches."""
    parameter_bytes: int
    """A stage's stacked leaves (its layers' parameters and optimizer state)."""

    @property
    def bubble(self) -> float:
        """(stages - 1) / (microbatches + stages - 1)."""
        return (self.stages - 1) / (self.microbatches + self.stages - 1)

    @property
    def loop_seconds(self) -> float:
        return self.steps / 2 * (self.forward_seconds + self.backward_seconds)

    @property
    def idle_seconds(self) -> float:
        return self.bubble * self.loop_seconds

    @property
    def compute_seconds(self) -> float:
        return self.loop_seconds + self.other_seconds

    @property
    def comm_seconds(self) -> float:
        return self.permute_seconds + self.data_seconds

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.comm_seconds

    @property
    def peak_bytes(self) -> int:
        return self.activation_bytes + self.parameter_bytes

    def __str__(self) -> str:
        ms = 1e3
        return (
            f"estimate on {self.profile}: {self.seconds * ms:.3f} ms per step "
            f"({self.schedule}, {self.stages} stages x {self.microbatches} microbatches)\n"
            f"  layer loops  {self.loop_seconds * ms:.3f} ms: {self.steps} time steps of "
            f"forward {self.forward_seconds * ms:.4f} ms / backward "
            f"{self.backward_seconds * ms:.4f} ms, idle {self.idle_seconds * ms:.3f} ms "
            f"(bubble {self.bubble:.1%})\n"
            f"  outside      {self.other_seconds * ms:.3f} ms (head, update)\n"
            f"  permutes     {self.permute_seconds * ms:.3f} ms; stacked gradients over "
            f"the data axis {self.data_seconds * ms:.3f} ms\n"
            f"  memory/stage {self.activation_bytes / 2**20:.2f} MiB in-flight microbatches + "
            f"{self.parameter_bytes / 2**20:.2f} MiB stacked leaves"
        )


ONE_DEVICE = {"device": 1}
"""The mesh a stage's own work is estimated on: it runs on one device."""


def _loop_seconds(
    eqn: Any, profile: Profile, segments: StageSegments | None = None,
    segment: Segment | None = None,
) -> float:
    """The estimate of one `scan` equation alone: on one device, or split over
    the model axis as `segment` is (its collectives included)."""
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    fn = eqn_function(eqn)
    if segments is None or segment is None:
        return simulate(fn, avals, ONE_DEVICE, [], profile).compute_seconds
    spec = {
        f"args/{k}": {d: segments.axis} for k, d in enumerate(segment.operand_dims) if d is not None
    }
    found = simulate(fn, avals, {segments.axis: segments.parts}, [ManualPartition(spec)], profile)
    return found.seconds


def estimate_pipeline(
    structure: StepStructure,
    schedule: Schedule,
    axis: str,
    data_axis: str | None,
    mesh: Mesh,
    profile: Profile,
    zero: int = 0,
    segments: StageSegments | None = None,
) -> PipelineEstimate:
    """With `zero` (a ZeRO stage over `data_axis`), the stacked gradients are
    reduce-scattered and the updated layers all-gathered instead of one
    all-reduce, and a stage holds its share of the optimizer state (and at
    stage 3 of the parameters). With
    `segments` (Megatron), a time step lasts the loop split over the model
    axis as partir splits it, its all-reduces included, and a stage holds
    its model shard of the leaves Megatron splits."""
    micro = structure.micro
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in micro.jaxpr.invars]
    whole = simulate(jaxpr_as_fun(micro), avals, ONE_DEVICE, [], profile).compute_seconds
    forward = _loop_seconds(structure.micro_forward, profile)
    backward = _loop_seconds(structure.micro_backward, profile)
    other = max(0.0, whole - forward - backward)
    if segments is not None:
        forward = _loop_seconds(structure.micro_forward, profile, segments, segments.forward)
        backward = _loop_seconds(structure.micro_backward, profile, segments, segments.backward)
    axes = dict(mesh.axes)
    stage_link = profile.axis_levels(axes, (axis,))
    fwd, bwd = structure.micro_forward, structure.micro_backward
    act = grad = structure.activation_bytes
    permutes = sum(
        bool(schedule.forward_sends(t)) * collective_seconds("collective_permute", act, stage_link)
        + bool(schedule.backward_sends(t))
        * collective_seconds("collective_permute", grad, stage_link)
        for t in range(schedule.steps)
    )
    data = 0.0
    if data_axis is not None:
        split = segments.backward.result_dims if segments is not None else ()
        ys = sum(  # the stacked gradients, each stage's model shard of them with Megatron
            avals_bytes([v.aval]) // (segments.parts if segments and split[j] is not None else 1)
            for j, v in enumerate(bwd.outvars)
            if j >= bwd.params["num_carry"]
        )
        data_link = profile.axis_levels(axes, (data_axis,))
        data = (
            collective_seconds("reduce_scatter", ys, data_link)
            + collective_seconds("all_gather", ys, data_link)
            if zero
            else collective_seconds("all_reduce", ys, data_link)
        )
    per_microbatch = act + avals_bytes(v.aval for v in fwd.outvars) + grad
    invars = structure.local.jaxpr.invars
    parts = axes[data_axis] if zero and data_axis is not None else 1
    shared = structure.zero_split(zero)
    model = segments.leaf_dims if segments is not None else {}
    stacked = sum(
        avals_bytes([invars[i].aval])
        // (parts if i in shared else 1)
        // (segments.parts if segments is not None and i in model else 1)
        for i in structure.stacked
    )
    return PipelineEstimate(
        profile.name,
        schedule.name,
        schedule.stages,
        schedule.microbatches,
        schedule.steps,
        forward,
        backward,
        other,
        permutes,
        data,
        schedule.slots * per_microbatch,
        stacked,
    )


# --- this engine's report (`PipelinedLowered.report`) --------------------------------


def _split(spec: Any) -> str:
    """`P(("stage", "batch"), None, "model")` as `dim 0 over "stage" x "batch",
    dim 2 over "model"` (axis names escaped)."""
    parts = []
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        parts.append(f"dim {dim} over " + " x ".join(quoted(a) for a in axes))
    return ", ".join(parts)


@dataclass(frozen=True)
class PipelineReport:
    tactic: Pipeline
    schedule: Schedule
    structure: StepStructure
    in_specs: tuple[Any, ...]
    """Each argument leaf's PartitionSpec (the stage axis on the layer dim,
    with ZeRO the data axis too, with Megatron the model axis on its dim)."""
    estimate: Any = None
    """The jaxpr engine's `PipelineEstimate`, if asked."""

    @property
    def transfer_bytes(self) -> int:
        """Bytes one run moves on the stage axis: each transfer is one
        microbatch's activation (forward) or its gradient (backward)."""
        return self.schedule.transfers * self.structure.activation_bytes

    def tables(self) -> list[Table]:
        s, sched = self.structure, self.schedule
        per_stage = s.layers // sched.stages
        stages = Table(
            "stages",
            ("stage", "layers", "in flight (slots)"),
            [
                (str(k), f"{k * per_stage}..{(k + 1) * per_stage - 1}", str(sched.slots))
                for k in range(sched.stages)
            ],
        )
        stacked = Table(
            f"split over {quoted(self.tactic.axis)} on the layer dim",
            ("leaf", "split"),
            [
                (quoted(display_path(s.arg_names[i])), _split(self.in_specs[i]))
                for i in s.stacked
            ],
        )
        return [stages, stacked]

    def to_text(self) -> str:
        sched = self.schedule
        head = (
            f"Pipeline over {quoted(self.tactic.axis)}: {self.structure.layers} layers, "
            f"{sched.stages} stages, batch {self.structure.batch} in {sched.microbatches} "
            f"microbatches of {self.structure.micro_rows} rows per shard\n"
            f"transfers on {quoted(self.tactic.axis)}: {sched.transfers} "
            f"(2 x (stages - 1) x microbatches), {self.transfer_bytes} bytes\n{sched}\n"
        )
        text = head + "\n" + render_plain(self.tables())
        return text + (f"\n{self.estimate}\n" if self.estimate is not None else "")

    def __str__(self) -> str:
        return self.to_text()


# --- this engine's ONNX export (`PipelinedLowered.to_onnx`) -------------------------

STAGE_SCOPE = "partir_pipeline_stage_"
"""The named scope a stage's ops are traced under: `partir_pipeline_stage_3`."""


def stage_scope(stage: int) -> str:
    return f"{STAGE_SCOPE}{stage}"


def stage_of(name_stack: str | None) -> int | None:
    """The stage a name stack's scope says (the innermost), or None."""
    for segment in reversed((name_stack or "").split("/")):
        if segment.startswith(STAGE_SCOPE) and segment[len(STAGE_SCOPE) :].isdigit():
            return int(segment[len(STAGE_SCOPE) :])
    return None


def unrolled_step(
    closed: ClosedJaxpr, loops: Sequence[int], layer_scope: Callable[[int], str],
    scoped: dict[int, str],
) -> Callable[..., list[Any]]:
    """`closed` as a function of its inputs, with the scans at `loops` (equation
    indices) run one layer at a time, layer `l` under `layer_scope(l)`, and the
    equations in `scoped` under their scope."""

    def step(index: int, eqn: JaxprEqn, operands: list[Any]) -> list[Any]:
        if index in loops:
            return _unrolled_scan(eqn, operands, layer_scope)
        if index in scoped:
            with jax.named_scope(scoped[index]):
                return run_eqn(eqn, operands)
        return run_eqn(eqn, operands)

    return lambda *leaves: run_jaxpr(closed.jaxpr, closed.consts, leaves, step)


def _unrolled_scan(eqn: JaxprEqn, operands: list[Any], scope: Callable[[int], str]) -> list[Any]:
    """A `scan` equation run layer by layer (in reverse for a reverse scan),
    its per-layer outputs stacked back on a leading layer dim."""
    params = eqn.params
    consts, carries = params["num_consts"], params["num_carry"]
    length = params["length"]
    body = jaxpr_as_fun(params["jaxpr"])
    carry = operands[consts : consts + carries]
    xs = operands[consts + carries :]
    per_layer: list[list[Any]] = [[] for _ in range(length)]
    order = range(length - 1, -1, -1) if params["reverse"] else range(length)
    for layer in order:
        with jax.named_scope(scope(layer)):
            parts = [lax.index_in_dim(x, layer, keepdims=False) for x in xs]
            outs = body(*operands[:consts], *carry, *parts)
        carry, per_layer[layer] = list(outs[:carries]), list(outs[carries:])
    stacked = [jnp.stack(ys) for ys in zip(*per_layer, strict=True)]
    return [*carry, *stacked]


def _export_pipelined(
    structure: StepStructure,
    schedule: Schedule,
    axis: str,
    out_tree: Any,
    mesh: Any,
    *,
    name: str = "partir_program",
) -> Any:
    """The ONNX model of a pipelined step (`PipelinedLowered.to_onnx`: its
    structure, schedule, stage axis, result tree and mesh): the global step
    with its two layer loops unrolled, layer `l`'s ops traced under the
    named scope of stage `l // (layers / stages)`, the head's ops that read
    the forward loop's output under the last stage's; each of these nodes
    gets `pipeline_stage`."""
    from partir.onnx_interop.export import build_model

    s = structure
    stages = schedule.stages
    per_stage = s.layers // stages
    late, _ = s.head_split()
    step = unrolled_step(
        s.full,
        (s.forward, s.backward),
        lambda layer: stage_scope(layer // per_stage),
        dict.fromkeys(late, stage_scope(stages - 1)),
    )
    shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in s.full.jaxpr.invars]
    traced = jax.jit(step, keep_unused=True).lower(*shapes)
    module = import_lowered(traced.compiler_ir("stablehlo"))
    entry = entry_function(module)
    name_arguments(entry, list(s.arg_names))
    outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in s.full.jaxpr.outvars]
    name_results(entry, result_paths(jax.tree_util.tree_unflatten(out_tree, outs)))
    placed = {
        number: stage
        for number, op in enumerate(entry.body.block.ops)
        if (stage := stage_of(source_location(op.location).name_stack)) is not None
    }
    results = [
        Distribution(((axis,), *(() for _ in out.shape[1:]))) if i in s.stacked_results else None
        for i, out in enumerate(outs)
    ]
    return build_model(module, mesh, {}, results, name=name, pipeline_stages=placed)
