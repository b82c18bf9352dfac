"""`partir.jit`: partition a JAX function over a mesh and run it there.

    mesh = partir.Mesh({"batch": 4, "model": 2})   # or a jax.sharding.Mesh

    @partir.jit(mesh=mesh, tactics=[partir.BatchParallel("batch"), partir.Megatron("model")])
    def train_step(params, opt_state, x, y): ...

Calling `train_step` imports the function as StableHLO, applies the tactics
(each followed by propagation), lowers to SPMD, emits a `jax.shard_map`
program and compiles it; the result is cached per pytree structure, shapes and
dtypes of the arguments. `train_step.lower(*args)` stops before running and
exposes every stage.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline

from dialects.context import make_context
from dialects.errors import PartirTypeError, PartirValueError
from dialects.heap import paused_gc
from lowering.collectives import Collective, collectives
from lowering.loader import load_source
from lowering.to_spmd import LowerToSpmdPass
from partir.cost import Estimate, Profile, estimate
from partir.generated_files import write_private, write_source
from partir.importer import check_arguments, import_program
from partir.keys import KeyBoundary
from partir.mesh import Mesh
from partir.partition import Stage, find_stage, partition
from partir.passes import EmitJaxPass
from partir.pipeline.tactic import Pipeline
from partir.report import Report, build_report
from partir.search import SearchResult
from partir.tactics import Tactic, check_tactics
from rewrites.conflicts import Conflict, recorded_conflicts

_CONTEXT = make_context()


def devices_for(mesh: Mesh, jax_mesh: jax.sharding.Mesh | None) -> jax.sharding.Mesh:
    """The JAX mesh to run on: the one given, or the first devices, row-major."""
    for axis in mesh.axes if jax_mesh is None else jax_mesh.axis_names:
        if not isinstance(axis, str) or not axis.isascii() or "\\" in axis:
            raise PartirValueError(
                f"mesh axis {axis!r} cannot run on JAX: XLA aborts the process on axis "
                "names with non-ASCII characters or backslashes; rename the axis "
                "(the IR stages and emitted source take any name)"
            )
    if jax_mesh is not None:
        return jax_mesh
    devices = jax.devices()
    if mesh.size > len(devices):
        raise PartirValueError(
            f"the mesh {mesh.axes} needs {mesh.size} devices, but jax.devices() has "
            f"{len(devices)} ({devices[0].platform}); on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before importing jax"
        )
    grid = np.array(devices[: mesh.size]).reshape(tuple(mesh.axes.values()))
    return jax.sharding.Mesh(grid, tuple(mesh.axes), axis_types=_axis_types(mesh))


def _axis_types(mesh: Mesh) -> tuple[jax.sharding.AxisType, ...]:
    """Auto axes, or the axis types of the mesh `jax.set_mesh` holds where it
    is this mesh (explicit mode): `shard_map` refuses a mesh whose axis types
    differ from the context's."""
    context = jax.sharding.get_abstract_mesh()
    names = tuple(getattr(context, "axis_names", ()))
    sizes = tuple(getattr(context, "axis_sizes", ()))
    if names == tuple(mesh.axes) and sizes == tuple(mesh.axes.values()):
        return tuple(context.axis_types)
    return (jax.sharding.AxisType.Auto,) * len(mesh.axes)


@dataclass
class Compiled:
    """A partitioned program, built for one JAX mesh and argument signature."""

    program: ModuleType
    jax_mesh: jax.sharding.Mesh
    out_tree: Any
    run: Callable[..., Any]
    keys: KeyBoundary = field(default_factory=KeyBoundary)

    def __call__(self, *args: Any) -> Any:
        leaves = jax.tree_util.tree_leaves(self.keys.raw(args))
        if jax.sharding.AxisType.Explicit in self.jax_mesh.axis_types:
            # explicit mode: shard_map takes arrays typed as its in_specs say
            specs = self.program.IN_SPECS
            leaves = [
                jax.device_put(leaf, jax.sharding.NamedSharding(self.jax_mesh, spec))
                for leaf, spec in zip(leaves, specs, strict=True)
            ]
        outs = self.run(*leaves)
        return self.keys.typed(jax.tree_util.tree_unflatten(self.out_tree, list(outs)))


@dataclass
class Lowered:
    """Every stage of one partitioning, without running it.

    The core stages are not kept while partitioning (a snapshot per tactic
    cost a copy of the whole program each): `stages` replays the partition on
    a copy of the import when first read. The partition is deterministic, so
    the replay's stages are the ones the emitted program came from."""

    imported: ModuleOp
    """The program as imported, before any tactic (a private copy)."""
    tactics: Sequence[Tactic]
    """The schedule, each `Automatic` holding what its search chose."""
    module: ModuleOp
    source: str
    conflicts: list[Conflict]
    out_tree: Any
    mesh: Mesh
    jax_mesh: jax.sharding.Mesh | None = None
    name: str = "partir_program"
    keys: KeyBoundary = field(default_factory=KeyBoundary)
    """Which arguments and results are typed PRNG keys (run as their data)."""
    searches: list[SearchResult] = field(default_factory=list)
    """What each `Automatic` searched and chose: `searches[0].schedule_source`
    is the schedule to paste in its place, `.table()` the top candidates. An
    `Automatic` in `tactics` holds its choice, so `stages` replays it."""
    _source_path: Path | None = field(default=None, repr=False)
    _stages: list[Stage] | None = field(default=None, repr=False)

    @property
    def stages(self) -> list[Stage]:
        """"import", one stage per tactic (`partir.partition.stage_names`), "spmd".

        The tactics' stages are replayed by the rewrite engine, one tactic at a
        time, so they read as `partir-opt`'s tactic passes print them (the same
        shardings and collectives as the decided path `lower` ran)."""
        if self._stages is None:
            replayed = partition(
                self.imported.clone(), self.mesh, self.tactics, keep_stages=True, engine="rewrite"
            )
            self._stages = [*replayed.stages, Stage("spmd", self.module)]
        return self._stages

    @property
    def collectives(self) -> list[Collective]:
        return collectives(self.module)

    def stage(self, key: str | int, *, locations: bool = False) -> str:
        """The IR text of a stage: "import", a tactic's name ("ZeRO#2" for the
        second ZeRO), "spmd", or an index into `stages`; printed when read.
        With `locations`, each op is followed by where the user's code made it
        (`loc("jit(f)/dot_general"("f"("model.py":12:8)))`), which parses back."""
        stage = find_stage(self.stages, key)
        return stage.located_text if locations else stage.text

    @property
    def source_path(self) -> Path:
        """Where the emitted source is written (named by its content hash), on
        first ask, in a private per-user directory (`partir.generated_files`)."""
        if self._source_path is None:
            self._source_path = write_source(self.source, self.name)
        return self._source_path

    def report(self, profile: Profile | str | None = None) -> Report:
        """Shardings, collectives, replicated ops and memory (`partir.report`):
        read from the SPMD module, with the last core stage for the ops it
        left outside every loop; with `profile`, the predicted step on it
        (`estimate`). For XLA's figures beside the estimate:
        `.report().with_xla(XlaMemory.of(lowered.compile(), args))`."""
        chosen = Profile.load(profile) if isinstance(profile, str) else profile
        return build_report(self.module, core=self.stages[-2].module, profile=chosen)

    def estimate(self, profile: Profile | str) -> Estimate:
        """The predicted step on `profile` (a `Profile`, a shipped profile's
        name or a JSON file; see `partir.cost`)."""
        chosen = profile if isinstance(profile, Profile) else Profile.load(profile)
        return estimate(self.module, chosen)

    def to_onnx(self, path: str | Path | None = None) -> Any:
        """This program as an ONNX model (`onnx.ModelProto`) annotated with the
        ONNX multi-device proposal's sharding specs, as partir decided them
        (`partir.onnx_interop.export`); written to `path` (0600) if given.
        Needs the `onnx` extra (`pip install 'partir[onnx]'`)."""
        from partir.onnx_interop.export import export_module

        def replay(module: ModuleOp) -> None:
            partition(module, self.mesh, self.tactics)

        model = export_module(
            self.imported,
            self.mesh,
            replay,
            name=self.name,
            expected_collectives=[(c.kind, c.axes, c.bytes_per_device) for c in self.collectives],
        )
        if path is not None:
            write_private(Path(path), model.SerializeToString())
        return model

    def compile(self) -> Compiled:
        jax_mesh = devices_for(self.mesh, self.jax_mesh)
        program = load_source(self.source, self.name)
        return Compiled(program, jax_mesh, self.out_tree, program.build(jax_mesh), self.keys)


@paused_gc()
def lower(
    fn: Callable[..., Any],
    args: Sequence[Any],
    mesh: Mesh,
    tactics: Sequence[Tactic],
    *,
    jax_mesh: jax.sharding.Mesh | None = None,
    name: str | None = None,
) -> Lowered:
    """Import `fn` at `args`, `partition` it (the tactic passes), then run
    `partir-lower-spmd` and `partir-emit-jax`, as `partir-opt` would
    (the collector paused throughout: `dialects.heap.paused_gc`)."""
    keys = KeyBoundary.of(tuple(args))
    fn, args = keys.raw_function(fn), keys.raw(tuple(args))
    imported = import_program(fn, *args, supported_only=True)
    module = imported.module
    original = Stage.snapshot("import", module).module
    partitioned = partition(module, mesh, tactics)
    label = name or getattr(fn, "__name__", None) or "program"
    label = "".join(c if c.isalnum() else "_" for c in label) or "program"
    emit = EmitJaxPass(program=label)
    PassPipeline((LowerToSpmdPass(), emit)).apply(_CONTEXT, module)
    return Lowered(
        original,
        tuple(partitioned.decided),
        module,
        emit.source,
        recorded_conflicts(module),
        imported.out_tree,
        mesh,
        jax_mesh,
        label,
        keys,
        searches=partitioned.searches,
    )


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    leaves, tree = jax.tree_util.tree_flatten(args)

    def dtype(x: Any) -> Any:
        return x.dtype if hasattr(x, "dtype") else np.result_type(x)

    return (
        tree,
        tuple(
            (
                np.shape(x),
                str(jax.dtypes.canonicalize_dtype(dtype(x))),
                isinstance(x, int | float | complex | bool),
            )
            for x in leaves
        ),
    )


class PartitionedFunction:
    """What `partir.jit` returns: call it like the function, or `.lower` it."""

    def __init__(
        self,
        fn: Callable[..., Any],
        mesh: Mesh | jax.sharding.Mesh,
        tactics: Sequence[Tactic],
        check: bool = False,
    ):
        self.fn = fn
        self.check = check
        self._checked: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.jax_mesh = mesh if isinstance(mesh, jax.sharding.Mesh) else None
        self.mesh = Mesh(mesh) if not isinstance(mesh, Mesh) else mesh
        self.tactics = check_tactics(tactics)
        self._compiled: dict[tuple[Any, ...], Any] = {}
        # what `.lower` made and no call has compiled yet: the call reuses it
        self._lowered: dict[tuple[Any, ...], Any] = {}
        functools.update_wrapper(self, fn)

    def _positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Keyword arguments bound to their positions, as the signature says
        (the program's arguments are named by parameter, so names survive)."""
        if not kwargs:
            return args
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        if bound.kwargs:
            raise PartirTypeError(
                f"partir.jit: {', '.join(bound.kwargs)} can only be passed by keyword; "
                "partir needs every argument to have a position: make the parameter "
                "positional (drop the `*`), or fix it with functools.partial"
            )
        return tuple(bound.args)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """A `Lowered`; with a `Pipeline` among the tactics, a
        `partir.pipeline.lowered.PipelinedLowered` (built from the step's jaxpr).
        A later call at the same shapes runs it rather than partitioning again."""
        args = self._positional(args, kwargs)
        lowered: Any
        if self._pipelined:
            from partir.pipeline.lowered import lower_pipeline

            jax_mesh = devices_for(self.mesh, self.jax_mesh)
            lowered = lower_pipeline(self.fn, args, self.mesh, self.tactics, jax_mesh)
        else:
            lowered = lower(self.fn, args, self.mesh, self.tactics, jax_mesh=self.jax_mesh)
        key = _signature(KeyBoundary.of(args).raw(args))
        if key not in self._compiled:
            self._lowered[key] = lowered
        return lowered

    def _lowered_for(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        """The lowering `.lower` made at these shapes (taken: the call
        compiles it once), or a new one."""
        lowered = self._lowered.pop(key, None)
        if lowered is None:
            lowered = self.lower(*args)
            self._lowered.pop(key, None)
        return lowered

    @property
    def _pipelined(self) -> bool:
        return any(isinstance(t, Pipeline) for t in self.tactics)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self._positional(args, kwargs)
        raw = KeyBoundary.of(args).raw(args)
        check_arguments(self.fn, raw)
        key = _signature(raw)
        compiled = self._compiled.get(key)
        if compiled is None and self._pipelined:
            if self.check:
                raise PartirValueError(
                    "partir.jit(check=True) validates IR stages, which a Pipeline step "
                    "does not have; compare it with jax.jit instead"
                )
            compiled = self._compiled[key] = self._lowered_for(key, args).compile()
        if compiled is None:
            lowered = self._lowered_for(key, args)
            compiled = self._compiled[key] = lowered.compile()
            if self.check:
                from partir.validation import CheckedCall

                # checked on the keys' data, as the stages hold them
                on_data = replace(compiled, keys=KeyBoundary())
                function = lowered.keys.raw_function(self.fn)
                self._checked[key] = CheckedCall(function, lowered, on_data)
        if self.check:
            return compiled.keys.typed(self._checked[key](*raw))
        return compiled(*args)


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    mesh: Mesh | jax.sharding.Mesh,
    tactics: Sequence[Tactic] = (),
    check: bool = False,
) -> Any:
    """Partition `fn` over `mesh` with `tactics`; usable as `@partir.jit(...)`.

    With `check=True` every call also runs each stage on its arguments and
    raises `partir.ValidationError` at the first whose numbers differ from
    `jax.jit(fn)` (slow: for finding a partitioning bug, see `partir.validation`)."""
    if fn is None:
        return lambda f: PartitionedFunction(f, mesh, tactics, check)
    return PartitionedFunction(fn, mesh, tactics, check)
