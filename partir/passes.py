"""Every partir pass, by name: the one registry `partir-opt` and `partir.jit` share.

A tactic is a pass: `tactic_pass` generates one from each dataclass of
`partir.tactics.TACTICS`, whose fields are the pass's options with the same
names and meaning (selectors as xDSL's `tuple[str, ...]` options). The pass
plans its tactic against the module and runs `ApplyPlanPass`, which is what
`partir.partition` runs with the plans it made up front: tile, then propagate,
numbering actions after any already in the module. Propagation records the
conflicts it finds on the module (`rewrites.conflicts`). Placing a plan's tiles on
the module is `partir.tiling`'s.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from dialects.escaping import quoted
from dialects.functions import entry_function
from dialects.partir import MeshOp, OriginAttr
from lowering.to_jax import emit_jax
from lowering.to_spmd import LowerToSpmdPass
from partir.cost.profile import Profile
from partir.mesh import Mesh
from partir.pipeline.program import pipeline as schedule_pipeline
from partir.pipeline.tactic import Pipeline
from partir.plan import (
    ProgramView,
    TacticError,
    tactic_label,
)
from partir.plan_passes import ApplyPlanPass, AutomaticPass
from partir.selections import Selection, record_selections
from partir.tactics import TACTICS, Automatic, Tactic
from partir.tiling import declare_mesh, module_mesh
from rewrites.actions import TileAction, apply_tactic_action, take_action_numbers
from rewrites.conflicts import ConflictLog, record_conflicts
from rewrites.inline_calls import InlineCallsPass
from rewrites.propagation import PropagatePass


@dataclass(frozen=True)
class TacticPass(ModulePass):
    """Base of the generated tactic passes: plan the tactic, apply the plan."""

    TACTIC: typing.ClassVar[type[Tactic]]

    def tactic(self) -> Tactic:
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        return self.TACTIC.from_options(**options)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        mesh = Mesh(module_mesh(op, self.TACTIC.__name__).axes)
        tactic = self.tactic()
        try:
            plan = tactic.plan(ProgramView.of(entry_function(op)), mesh)
            if isinstance(tactic, Automatic):  # searches the module as it is
                AutomaticPass(tactic).apply(ctx, op)
                return
        except TacticError as err:
            raise PassFailedException(str(err)) from err
        ApplyPlanPass(plan).apply(ctx, op)


_SCALARS = (str, int, bool, float)


def _option(tactic_field: dataclasses.Field[Any], hint: Any) -> tuple[str, Any, Any]:
    """A tactic field as a pass option: scalars keep their type and default
    (an optional scalar, such as a memory limit, stays optional; a float
    option takes ints too); selectors and specs become `tuple[str, ...]`
    (unset: the tactic's default)."""
    has_default = tactic_field.default is not dataclasses.MISSING
    if hint in _SCALARS:
        default = tactic_field.default if has_default else dataclasses.MISSING
        return tactic_field.name, hint, field(default=default)
    members = typing.get_args(hint)
    scalars = [m for m in members if m in _SCALARS]
    listed = any(typing.get_origin(m) is not None for m in members)  # Sequence[str]
    if tactic_field.default is None and len(scalars) == 1 and not listed:
        return tactic_field.name, scalars[0] | None, field(default=None)
    if has_default:
        return tactic_field.name, tuple[str, ...] | None, field(default=None)
    return tactic_field.name, tuple[str, ...], field()


def tactic_pass(tactic: type[Tactic]) -> type[TacticPass]:
    """The `partir-opt` pass of `tactic`: one option per dataclass field."""
    assert dataclasses.is_dataclass(tactic)  # every tactic is a dataclass; Tactic is not
    hints = typing.get_type_hints(tactic, localns={"Profile": Profile})  # Automatic's
    options = [
        _option(f, hints[f.name])
        for f in dataclasses.fields(tactic)
        if f.metadata.get("pass_option", True)
    ]
    doc = (tactic.__doc__ or tactic.__name__).strip().splitlines()[0]
    return dataclasses.make_dataclass(
        f"{tactic.__name__}Pass",
        options,
        bases=(TacticPass,),
        frozen=True,
        namespace={
            "name": tactic.CLI_NAME,
            "TACTIC": tactic,
            "__doc__": doc,
            "__module__": __name__,
        },
    )


TACTIC_PASSES: dict[type[Tactic], type[TacticPass]] = {t: tactic_pass(t) for t in TACTICS}
"""Each tactic's generated pass."""


@dataclass(frozen=True)
class TilePass(ModulePass):
    """One tiling action on an argument (by index or name); run partir-propagate after."""

    name = "partir-tile"
    value: str | int = 0  # an argument index (value=0) or name (value=x)
    dim: int = 0
    axis: str = ""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        mesh_op = module_mesh(op, self.name)
        entry = entry_function(op)
        view = ProgramView.of(entry)
        value = str(self.value)
        if value.isdigit():
            index = int(value)
            if index >= len(view.arguments):
                raise PassFailedException(
                    f"{self.name}: the function has {len(view.arguments)} arguments, "
                    f"no argument {index}"
                )
            leaf = view.arguments[index]
        else:
            try:
                (leaf,) = view.find(value, who=self.name)
            except (TacticError, ValueError) as err:
                raise PassFailedException(str(err)) from err
        number = take_action_numbers(op, 1)
        action = TileAction(
            entry.body.block.args[leaf.index],
            self.dim,
            self.axis,
            OriginAttr(number, "partir-tile", leaf.name),
            leaf.name,
        )
        log = ConflictLog()
        try:
            apply_tactic_action(action, mesh_op, log)
        except ValueError as err:
            raise PassFailedException(f"{self.name}: {err}") from err
        record_conflicts(op, log.conflicts)
        rank = max(len(leaf.shape), 1)
        label = tactic_label(self.name, self.axis)
        chosen = Selection(label, leaf.name, self.dim % rank, self.axis, "named", f"value={value}")
        record_selections(op, [chosen])


@dataclass(frozen=True)
class DeclareMeshPass(ModulePass):
    """Declare the mesh: axes="batch=4","model=2" (no-op if the same mesh is there).

    One list item per axis, `name=size` (quoted, with escapes, as every pass
    option); an item with more than one `=` is refused rather than guessed at,
    since the old form `axes="batch=4,model=2"` would otherwise read as one axis
    named "batch=4,model".
    """

    name = "partir-declare-mesh"
    axes: tuple[str, ...]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        sizes: dict[str, int] = {}
        for item in self.axes:
            name, _, size = item.partition("=")
            if item.count("=") != 1 or not name or not (size.isascii() and size.isdigit()):
                raise PassFailedException(
                    f"{self.name}: cannot read {quoted(item)} in option axes; "
                    'write axes="batch=4","model=2" (one name=size per axis, sizes in digits)'
                )
            if name in sizes:
                raise PassFailedException(
                    f"{self.name}: option axes names axis {quoted(name)} twice "
                    f"(={sizes[name]} and ={size}); give each axis once"
                )
            sizes[name] = int(size)
        if not sizes:
            raise PassFailedException(
                f'{self.name}: option axes is empty; write axes="batch=4","model=2"'
            )
        try:
            declare_mesh(op, Mesh(sizes))
        except (TypeError, ValueError) as err:
            raise PassFailedException(f"{self.name}: {err}") from err


@dataclass(frozen=True)
class EmitJaxPass(ModulePass):
    """Emit the SPMD module as a jax.shard_map Python module (its `source`).

    As the last pass of `partir-opt`, the output is that Python module.
    """

    name = "partir-emit-jax"
    program: str = "partir_program"
    """The emitted function's name."""
    emitted: list[str] = field(default_factory=list, init=False, compare=False, repr=False)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        self.emitted[:] = [emit_jax(op, name=self.program)]  # raises UnsupportedOpError

    @property
    def source(self) -> str:
        """The source the last `apply` emitted."""
        if not self.emitted:
            raise ValueError(f"{self.name} has not run yet")
        return self.emitted[0]


PIPELINE = "partir.pipeline_request"
"""The module attribute `partir-pipeline` leaves for `partir-schedule-pipeline`:
the stage axis, the microbatches and the schedule."""


@dataclass(frozen=True)
class PipelinePass(ModulePass):
    """Pipeline the layer loop over `axis`: the batch split over microbatches
    (then partir-lower-spmd, partir-schedule-pipeline)."""

    name = "partir-pipeline"

    axis: str
    microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        mesh = Mesh(module_mesh(op, "Pipeline").axes)
        tactic = Pipeline(self.axis, self.microbatches, self.schedule, self.virtual_stages)
        try:
            per_microbatch, (split,) = tactic.microbatched(mesh, [])
            plan = split.plan(ProgramView.of(entry_function(op)), per_microbatch)
        except TacticError as err:
            raise PassFailedException(str(err)) from err
        declared = next(o for o in op.body.block.ops if isinstance(o, MeshOp))
        Rewriter.replace_op(declared, per_microbatch.to_op())
        op.attributes[PIPELINE] = DictionaryAttr(
            {
                "axis": StringAttr(self.axis),
                "microbatches": IntegerAttr(self.microbatches, i64),
                "schedule": StringAttr(self.schedule),
                "virtual_stages": IntegerAttr(self.virtual_stages, i64),
            }
        )
        ApplyPlanPass(plan).apply(ctx, op)


@dataclass(frozen=True)
class SchedulePipelinePass(ModulePass):
    """Run the SPMD program of a step `partir-pipeline` split into microbatches
    as its schedule over the stage axis (`partir.pipeline.program`)."""

    name = "partir-schedule-pipeline"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        spec = op.attributes.get(PIPELINE)
        if not isinstance(spec, DictionaryAttr):
            raise PassFailedException(
                "partir-schedule-pipeline: the module has no pipeline to schedule; run "
                "partir-pipeline{axis=... microbatches=...} before partir-lower-spmd"
            )
        axis, count, schedule = (spec.data[k] for k in ("axis", "microbatches", "schedule"))
        chunks = spec.data.get("virtual_stages", IntegerAttr(1, i64))
        assert isinstance(axis, StringAttr) and isinstance(count, IntegerAttr)
        assert isinstance(schedule, StringAttr) and isinstance(chunks, IntegerAttr)
        stages = module_mesh(op, "Pipeline").axes[axis.data]
        del op.attributes[PIPELINE]
        schedule_pipeline(
            op,
            axis=axis.data,
            stages=stages,
            microbatches=count.value.data,
            schedule=schedule.data,
            virtual_stages=chunks.value.data,
        )


_PASS_CLASSES: tuple[type[ModulePass], ...] = (
    DeclareMeshPass,
    InlineCallsPass,
    TilePass,
    *TACTIC_PASSES.values(),
    PropagatePass,
    PipelinePass,
    LowerToSpmdPass,
    SchedulePipelinePass,
    EmitJaxPass,
)


def _factory(pass_class: type[ModulePass]) -> Callable[[], type[ModulePass]]:
    """xDSL's pass registry maps a name to a function returning the class."""
    return lambda: pass_class


PASSES: dict[str, Callable[[], type[ModulePass]]] = {p.name: _factory(p) for p in _PASS_CLASSES}
"""Name -> pass class, for `partir-opt -p` and its --help."""
