"""Every partir pass, by name: the one registry `partir-opt` and `partir.jit` share.

A tactic pass plans its actions from the program's argument names, tiles,
and propagates, numbering its actions after any already in the module, so a
pipeline of passes is the same schedule as `partir.partition`. Conflicts
found on the way are recorded on the module (`partir.conflicts`) where the
report and the CLI can read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from dialects.escaping import quoted
from dialects.functions import entry_function
from dialects.partir import MeshOp, OriginAttr, find_mesh
from lowering.to_jax import emit_jax
from lowering.to_spmd import LowerToSpmdPass
from partir.mesh import Mesh
from partir.tactics import (
    BatchParallel,
    ManualPartition,
    Megatron,
    PlannedTile,
    ProgramView,
    Tactic,
    TacticError,
    ZeRO,
)
from rewrites.actions import TileAction, apply_tile_action
from rewrites.conflicts import Conflict, ConflictLog
from rewrites.inline_calls import InlineCallsPass
from rewrites.propagation import PropagatePass, paused_gc, propagate

CONFLICTS_ATTR = "partir.conflicts"


def _split(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def module_mesh(module: ModuleOp, who: str) -> MeshOp:
    mesh = find_mesh(module)
    if mesh is None:
        raise PassFailedException(
            f'{who}: the module declares no mesh; add `partir.mesh @mesh ["batch" = 4]` '
            'or run partir-declare-mesh{axes="batch=4"} first'
        )
    return mesh


ACTIONS_ATTR = "partir.actions"


def take_action_numbers(module: ModuleOp, count: int) -> int:
    """Reserve `count` action numbers; returns the first. The module keeps the
    running count, so numbers stay in schedule order across passes even when
    an action's loops have all been fused away."""
    current = module.attributes.get(ACTIONS_ATTR)
    first = (current.value.data if isinstance(current, IntegerAttr) else 0) + 1
    module.attributes[ACTIONS_ATTR] = IntegerAttr(first + count - 1, i64)
    return first


def _leaf_value(entry: func.FuncOp, tile: PlannedTile) -> SSAValue:
    if tile.leaf.kind == "argument":
        return entry.body.block.args[tile.leaf.index]
    ret = entry.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    return ret.arguments[tile.leaf.index]


def record_conflicts(module: ModuleOp, conflicts: list[Conflict]) -> None:
    old = module.attributes.get(CONFLICTS_ATTR)
    entries = list(old.data) if isinstance(old, ArrayAttr) else []
    for c in conflicts:
        entry = DictionaryAttr(
            {
                "op": StringAttr(c.op),
                "axis": StringAttr(c.axis),
                "values": ArrayAttr([StringAttr(v) for v in c.values]),
                "winner": StringAttr(c.winner),
                "loser": StringAttr(c.loser),
                "detail": StringAttr(c.detail),
            }
        )
        if entry not in entries:
            entries.append(entry)
    if entries:
        module.attributes[CONFLICTS_ATTR] = ArrayAttr(entries)


def recorded_conflicts(module: ModuleOp) -> list[Conflict]:
    attr = module.attributes.get(CONFLICTS_ATTR)
    if not isinstance(attr, ArrayAttr):
        return []
    out = []
    for entry in attr.data:
        d = entry.data  # type: ignore[attr-defined]
        out.append(
            Conflict(
                d["op"].data,
                tuple(v.data for v in d["values"].data),
                d["axis"].data,
                d["winner"].data,
                d["loser"].data,
                d["detail"].data,
            )
        )
    return out


def apply_tactic(module: ModuleOp, tactic: Tactic) -> list[TileAction]:
    """Plan `tactic`, tile what it names, propagate; returns the actions."""
    with paused_gc():
        return _apply_tactic(module, tactic)


def _apply_tactic(module: ModuleOp, tactic: Tactic) -> list[TileAction]:
    mesh_op = module_mesh(module, tactic.name)
    entry = entry_function(module)
    planned = tactic.plan(ProgramView.of(entry), Mesh(mesh_op.axes))
    first = take_action_numbers(module, len(planned))
    log = ConflictLog()
    actions = []
    for number, tile in enumerate(planned, start=first):
        origin = OriginAttr(number, tactic.name, tile.leaf.name)
        action = TileAction(_leaf_value(entry, tile), tile.dim, tile.axis, origin, tile.leaf.name)
        apply_tile_action(action, mesh_op, log)
        actions.append(action)
    propagate(module, log)
    record_conflicts(module, log.conflicts)
    return actions


@dataclass(frozen=True)
class ApplyTacticPass(ModulePass):
    """Apply one tactic object and propagate (what `partir.jit` runs per tactic)."""

    name = "partir-apply-tactic"
    tactic: Tactic | None = None

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        assert self.tactic is not None
        apply_tactic(op, self.tactic)


class _TacticPass(ModulePass):
    """Base of the tactic passes: build the tactic from options, apply it."""

    def tactic(self) -> Tactic:
        raise NotImplementedError

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        try:
            apply_tactic(op, self.tactic())
        except TacticError as err:
            raise PassFailedException(str(err)) from err


@dataclass(frozen=True)
class BatchParallelPass(_TacticPass):
    """Tile dim 0 of the data arguments over `axis`, then propagate."""

    name = "partir-batch-parallel"
    axis: str = "batch"
    inputs: str | None = None  # comma-separated selectors; default: non-parameter arguments

    def tactic(self) -> Tactic:
        return BatchParallel(self.axis, inputs=_split(self.inputs))


@dataclass(frozen=True)
class MegatronPass(_TacticPass):
    """Megatron tensor parallelism over `axis` (column/row selectors optional)."""

    name = "partir-megatron"
    axis: str = "model"
    column: str | None = None
    column_bias: str | None = None
    row: str | None = None

    def tactic(self) -> Tactic:
        default = Megatron(self.axis)
        return Megatron(
            self.axis,
            column=_split(self.column) or default.column,
            column_bias=_split(self.column_bias) or default.column_bias,
            row=_split(self.row) or default.row,
        )


@dataclass(frozen=True)
class ZeROPass(_TacticPass):
    """ZeRO stage 1/2/3 over the data `axis`: shard state on dim 0."""

    name = "partir-zero"
    axis: str = "batch"
    stage: int = 3

    def tactic(self) -> Tactic:
        return ZeRO(self.axis, self.stage)


@dataclass(frozen=True)
class ManualPartitionPass(_TacticPass):
    """Tile named values: spec="x:0=batch;params/w1:1=model" (selector:dim=axis)."""

    name = "partir-manual-partition"
    spec: str = ""

    def tactic(self) -> Tactic:
        table: dict[str, dict[int, str]] = {}
        for item in filter(None, (p.strip() for p in self.spec.split(";"))):
            selector, _, tiling = item.rpartition(":")
            dim, _, axis = tiling.partition("=")
            if not selector or not axis or not dim.lstrip("-").isdigit():
                raise PassFailedException(
                    f'{self.name}: cannot read "{item}"; write selector:dim=axis, '
                    'e.g. spec="x:0=batch;params/w1:1=model"'
                )
            table.setdefault(selector, {})[int(dim)] = axis
        return ManualPartition(table)


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
            apply_tile_action(action, mesh_op, log)
        except ValueError as err:
            raise PassFailedException(f"{self.name}: {err}") from err
        record_conflicts(op, log.conflicts)


@dataclass(frozen=True)
class DeclareMeshPass(ModulePass):
    """Declare the mesh: axes="batch=4,model=2" (no-op if the same mesh is there)."""

    name = "partir-declare-mesh"
    axes: str = ""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from partir.partition import declare_mesh

        sizes: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in self.axes.split(","))):
            name, _, size = item.partition("=")
            name, size = name.strip(), size.strip()
            if not name or not (size.isascii() and size.isdigit()):
                raise PassFailedException(
                    f"{self.name}: cannot read {quoted(item)} in option axes; "
                    'write axes="batch=4,model=2" (name=size, sizes in decimal digits)'
                )
            if name in sizes:
                raise PassFailedException(
                    f"{self.name}: option axes names axis {quoted(name)} twice "
                    f"(={sizes[name]} and ={size}); give each axis once"
                )
            sizes[name] = int(size)
        if not sizes:
            raise PassFailedException(
                f'{self.name}: option axes is empty; write axes="batch=4,model=2"'
            )
        try:
            declare_mesh(op, Mesh(sizes))
        except (TypeError, ValueError) as err:
            raise PassFailedException(f"{self.name}: {err}") from err


@dataclass(frozen=True)
class EmitJaxPass(ModulePass):
    """Check that the SPMD module can be emitted as a jax.shard_map Python module.

    As the last pass of `partir-opt`, the output is that Python module.
    """

    name = "partir-emit-jax"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        emit_jax(op)  # raises UnsupportedOpError naming the op


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    p.name: (lambda p=p: p)
    for p in (
        DeclareMeshPass,
        InlineCallsPass,
        TilePass,
        BatchParallelPass,
        MegatronPass,
        ZeROPass,
        ManualPartitionPass,
        PropagatePass,
        LowerToSpmdPass,
        EmitJaxPass,
    )
}
"""Name -> pass class, for `partir-opt -p` and its --help."""
