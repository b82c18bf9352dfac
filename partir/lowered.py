"""What `partir.jit(...).lower(*args)` returns: every stage of one partitioning
(`Lowered`), and the program compiled for a JAX mesh (`Compiled`).

`lower` imports the function as StableHLO, applies the tactics (each followed
by propagation), lowers to SPMD and emits a `jax.shard_map` program, as
`partir-opt` would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline

from dialects.context import make_context
from dialects.heap import paused_gc
from lowering.collectives import Collective, collectives
from lowering.loader import load_source
from lowering.to_spmd import LowerToSpmdPass
from partir.cost import Estimate, Profile, estimate
from partir.devices import devices_for
from partir.generated_files import write_private, write_source
from partir.importer import ImportSource, import_program
from partir.keys import KeyBoundary
from partir.mesh import Mesh
from partir.partition import Stage, find_stage, partition
from partir.passes import EmitJaxPass
from partir.pipeline.program import pipeline as schedule_pipeline
from partir.pipeline.schedule import recorded_schedule
from partir.pipeline.tactic import Pipeline
from partir.report import Report, build_report
from partir.search import SearchResult
from partir.tactics import Tactic
from rewrites.conflicts import Conflict, recorded_conflicts

_CONTEXT = make_context()

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

    import_source: ImportSource
    """What imports the program again, as it was before any tactic
    (`imported`, on first read)."""
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
    partition_mesh: Mesh | None = None
    """The mesh `tactics` partition the step on, where it is not `mesh`: a
    pipelined step's, with its microbatch axis (`Pipeline.microbatched`)."""
    _source_path: Path | None = field(default=None, repr=False)
    _stages: list[Stage] | None = field(default=None, repr=False)
    _imported: ModuleOp | None = field(default=None, repr=False)

    @property
    def imported(self) -> ModuleOp:
        """The program as imported, before any tactic: imported again from
        JAX's module on first read (`ImportSource`), not copied while lowering."""
        if self._imported is None:
            self._imported = self.import_source.module()
        return self._imported

    @property
    def stages(self) -> list[Stage]:
        """"import", one stage per tactic (`partir.partition.stage_names`), "spmd".

        The tactics' stages are replayed on the import as `lower` partitioned
        it (decided and built once, `partir.partition.partition_decided`):
        tactic k's stage is the first k tactics' decision, built."""
        if self._stages is None:
            replayed = partition(
                self.imported.clone(),
                self.partition_mesh or self.mesh,
                self.tactics,
                keep_stages=True,
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
        (`partir.onnx_interop.export`), and for a pipelined step each node's
        `pipeline_stage` (`partir.onnx_interop.pipeline`); written to `path`
        (0600) if given.
        Needs the `onnx` extra (`pip install 'partir[onnx]'`)."""
        from partir.onnx_interop.export import export_module
        from partir.onnx_interop.pipeline import export_pipelined

        def replay(module: ModuleOp) -> None:
            partition(module, self.partition_mesh or self.mesh, self.tactics)

        expected = [(c.kind, c.axes, c.bytes_per_device) for c in self.collectives]
        recorded = recorded_schedule(self.module)
        if recorded is None:
            model = export_module(
                self.imported, self.mesh, replay, name=self.name, expected_collectives=expected
            )
        else:
            axis, schedule = recorded

            def scheduled(module: ModuleOp) -> None:
                schedule_pipeline(
                    module,
                    axis=axis,
                    stages=schedule.stages,
                    microbatches=schedule.microbatches,
                    schedule=schedule.name,
                    virtual_stages=schedule.chunks,
                )

            model = export_pipelined(
                self.imported,
                self.mesh,
                replay,
                scheduled,
                name=self.name,
                expected_collectives=expected,
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
    pipe = next((t for t in tactics if isinstance(t, Pipeline)), None)
    partition_mesh = mesh
    if pipe is not None:
        partition_mesh, tactics = pipe.microbatched(mesh, [t for t in tactics if t is not pipe])
    partitioned = partition(module, partition_mesh, tactics)
    label = name or getattr(fn, "__name__", None) or "program"
    label = "".join(c if c.isalnum() else "_" for c in label) or "program"
    emit = EmitJaxPass(program=label)
    PassPipeline((LowerToSpmdPass(),)).apply(_CONTEXT, module)
    if pipe is not None:
        schedule_pipeline(
            module,
            axis=pipe.axis,
            stages=mesh.axes[pipe.axis],
            microbatches=pipe.microbatches,
            schedule=pipe.schedule,
            virtual_stages=pipe.virtual_stages,
        )
    PassPipeline((emit,)).apply(_CONTEXT, module)
    return Lowered(
        imported.source,
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
        partition_mesh=partition_mesh,
    )
