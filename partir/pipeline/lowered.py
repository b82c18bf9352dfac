"""A pipelined step, lowered: its structure, schedule, program and report.

What `partir.jit(...).lower(*args)` returns when the tactics hold a
`Pipeline`: the same questions as `partir.lowered.Lowered` (compile it, report
it, estimate it), answered for a program built from the step's jaxpr.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from xdsl.dialects.builtin import TensorType, f32

from dialects.errors import PartirValueError
from partir.cost.pipeline import PipelineEstimate, estimate_pipeline
from partir.cost.profile import Profile
from partir.generated_files import write_private
from partir.mesh import Mesh
from partir.pipeline.engine import PipelineProgram, backward_layout
from partir.pipeline.megatron import stage_segments
from partir.pipeline.schedule import Schedule, make_schedule
from partir.pipeline.structure import (
    PipelineError,
    StepStructure,
    find_structure,
    mirrored_params,
)
from partir.pipeline.tactic import Pipeline
from partir.plan import Leaf, ProgramView
from partir.report.pipeline import PipelineReport
from partir.tactics import Megatron, Tactic


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
        from partir.onnx_interop.pipeline import export_pipelined

        model = export_pipelined(
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
