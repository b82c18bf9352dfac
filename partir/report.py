"""What a partitioning did, as plain data: shardings, collectives, replication, memory.

`build_report(module)` accepts a module at any stage:

- SPMD (`spmd.*` ops, `!spmd.dtensor` arguments): read directly; every body op
  carries its result's distribution in its `dist` attribute.
- core (a `partir.mesh`, loops, no SPMD ops; the import stage too): a clone
  is lowered with `lower_to_spmd`, and the report is read from that, so the
  distributions are the same notions at every stage. The core module itself
  says which ops were left outside every loop (`replicated_ops`).
- plain StableHLO (no mesh): lowered over an empty mesh, so every value is
  replicated and nothing is communicated (and no op is listed as replicated:
  without a mesh there is nothing to partition it over).

`Report.stage` is "spmd", "core" (loops) or "stablehlo" (no loops yet: the
import stage, with or without a mesh).

Values are named as the printer names them (`%x_1`, `%42`), so a row can be
found in the stage text: for a core-stage input that is the text of its SPMD
lowering. Sizes are bytes per device. `Report.to_json()` is the stable,
machine-readable form; `Report.tables()` the human one (`partir-inspect`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from io import StringIO
from typing import TYPE_CHECKING, Any

from xdsl.dialects import func
from xdsl.dialects.builtin import DictionaryAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue
from xdsl.printer import Printer

from dialects.context import make_context
from dialects.functions import entry_function
from dialects.names import op_name
from dialects.parser import PartirParser
from dialects.partir import ORIGIN, LoopOp, MeshOp, OriginAttr, find_mesh
from dialects.spmd import DIST, SPMD, DTensorType, FromLocalOp, ToLocalOp
from lowering.collectives import collectives, tensor_bytes
from lowering.distributions import NEEDED_BY
from lowering.to_spmd import lower_to_spmd
from partir.passes import recorded_conflicts
from rewrites.conflicts import Conflict
from rewrites.distribution import Tiling, visible_tilings
from rewrites.registry import OpRule, opaque_reason, rule_for

if TYPE_CHECKING:
    from partir.api import Compiled

NAME_ATTR = "partir.name"
UNKNOWN = "unknown"
_SPMD_OPS = {op.name for op in SPMD.operations}

# --------------------------------------------------------------------------
# The report's rows
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueInfo:
    """One value of the entry function: its global and per-device shape, and how
    it is distributed (None where the lowering could not tell: never guessed)."""

    name: str
    op: str
    partir_name: str | None
    dtype: str
    local_shape: tuple[int, ...]
    bytes_per_device: int
    global_shape: tuple[int, ...] | None = None
    dim_axes: tuple[tuple[str, ...], ...] | None = None
    partial_axes: tuple[str, ...] | None = None
    properties: dict[str, str] | None = None
    """DistPar's property per mesh axis: "S(d)" split on dim d, "B" broadcast, "P" partial."""

    @property
    def sharding(self) -> str:
        if self.properties is None:
            return UNKNOWN
        if not self.properties:
            return "replicated"
        return ", ".join(f"{axis}={prop}" for axis, prop in self.properties.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "partir_name": self.partir_name,
            "dtype": self.dtype,
            "global_shape": _list(self.global_shape),
            "dims": None if self.dim_axes is None else [list(d) for d in self.dim_axes],
            "partial": _list(self.partial_axes),
            "properties": self.properties if self.properties is not None else UNKNOWN,
            "local_shape": list(self.local_shape),
            "bytes_per_device": self.bytes_per_device,
        }


@dataclass(frozen=True)
class CollectiveInfo:
    """One collective: what it moves per device, the op that needed it, and
    the action (tactic and value) that made the value distributed."""

    name: str
    kind: str
    axes: tuple[str, ...]
    operand: str
    result: str
    bytes_per_device: int
    needed_by: str | None
    action: int | None
    tactic: str | None
    value: str | None

    @property
    def cause(self) -> str:
        if self.action is None:
            return "an unrecorded action"
        what = f" of {self.value}" if self.value else ""
        return f"action {self.action} ({self.tactic}{what})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "axes": list(self.axes),
            "operand": self.operand,
            "result": self.result,
            "bytes_per_device": self.bytes_per_device,
            "needed_by": self.needed_by,
            "action": self.action,
            "tactic": self.tactic,
            "value": self.value,
        }


OPAQUE = "opaque"
CONFLICT = "conflict"
BLOCKED = "blocked"
UNTILED = "untiled"


@dataclass(frozen=True)
class ReplicatedOp:
    """A core-stage op outside every loop (computed whole on every device), and why.

    `reason`: "opaque" (the registry has no rule; `detail` is its reason),
    "conflict" (a conflict record names it; `conflict` is the record),
    "blocked" (a tiled operand reached it, but the registry forbids that
    tiling; `detail` says why) or "untiled" (no tiled operand reached it).

    Propagation lets the earlier action win a conflict and tile the op, so an
    op named by a conflict record is normally inside the winner's loop and
    the loser's value is redistributed (a collective in the SPMD stage); the
    "conflict" reason appears only for core IR written or edited elsewhere.
    """

    name: str
    op: str
    reason: str
    detail: str
    conflict: Conflict | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "reason": self.reason,
            "detail": self.detail,
            "conflict": None if self.conflict is None else _conflict_json(self.conflict),
        }


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device: the arguments, and a peak estimate by liveness.

    The peak is the arguments plus the largest sum, over program order of the
    flat SPMD body, of the intermediates live at one point. A value is live
    from the op defining it to its last use; values returned stay live to the
    end; `spmd.to_local`/`spmd.from_local` only rename a buffer and add
    nothing. Every op result is counted as materialised.

    XLA's number differs: it fuses elementwise chains (most intermediates of
    a layernorm or softmax never exist in memory), reuses buffers whose
    lifetimes do not overlap in its own schedule, and may alias outputs to
    inputs. So this is an upper-bound-style figure for comparing schedules
    and tactics against each other, not a prediction of XLA's allocation;
    `XlaMemory` holds XLA's own figures when a compiled program is at hand.
    """

    arguments: int
    peak_intermediates: int
    peak_at: str

    @property
    def peak(self) -> int:
        return self.arguments + self.peak_intermediates

    def to_json(self) -> dict[str, Any]:
        return {
            "arguments_bytes_per_device": self.arguments,
            "peak_intermediates_bytes_per_device": self.peak_intermediates,
            "peak_bytes_per_device": self.peak,
            "peak_at": self.peak_at,
        }


@dataclass(frozen=True)
class XlaMemory:
    """XLA's per-device figures for the compiled program (`memory_analysis()`).

    Only a compiled program has them, so a report from MLIR text never does;
    `Report.with_xla(XlaMemory.of(compiled, args))` puts them beside the
    estimate (`partir-inspect` on a file cannot show them).
    """

    arguments: int
    outputs: int
    temporaries: int
    aliased: int

    @property
    def arguments_and_temporaries(self) -> int:
        return self.arguments + self.temporaries

    @property
    def total(self) -> int:
        """Arguments, outputs and temporaries, counting aliased buffers once."""
        return self.arguments + self.outputs + self.temporaries - self.aliased

    @classmethod
    def from_stats(cls, stats: Any) -> XlaMemory:
        return cls(stats.argument_size_in_bytes, stats.output_size_in_bytes,
                   stats.temp_size_in_bytes, stats.alias_size_in_bytes)

    @classmethod
    def of(cls, compiled: Compiled, args: Sequence[Any]) -> XlaMemory:
        """Compile `compiled.run` for `args` placed as the program expects them
        (each leaf on `NamedSharding(mesh, spec)` for its `IN_SPECS` entry)."""
        import jax
        from jax.sharding import NamedSharding

        leaves = jax.tree_util.tree_leaves(args)
        specs = compiled.program.IN_SPECS
        placed = [jax.device_put(x, NamedSharding(compiled.jax_mesh, spec))
                  for x, spec in zip(leaves, specs, strict=True)]
        return cls.from_stats(compiled.run.lower(*placed).compile().memory_analysis())

    def to_json(self) -> dict[str, Any]:
        return {
            "arguments_bytes_per_device": self.arguments,
            "outputs_bytes_per_device": self.outputs,
            "temporaries_bytes_per_device": self.temporaries,
            "aliased_bytes_per_device": self.aliased,
        }


@dataclass(frozen=True)
class Table:
    """A titled table of strings: what text renderers (plain or rich) draw."""

    title: str
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """Everything `partir-inspect` shows about one module; see the module docstring."""

    stage: str
    mesh: dict[str, int]
    values: list[ValueInfo]
    results: list[ValueInfo]
    collectives: list[CollectiveInfo]
    replicated_ops: list[ReplicatedOp]
    conflicts: list[Conflict]
    memory: MemoryEstimate
    core_available: bool = True
    """False for an SPMD module reported without its core stage (no `replicated_ops`)."""
    xla: XlaMemory | None = field(default=None)

    @property
    def arguments(self) -> list[ValueInfo]:
        return [v for v in self.values if v.op == "argument"]

    @property
    def bytes_communicated(self) -> int:
        """Per device, summed over every collective."""
        return sum(c.bytes_per_device for c in self.collectives)

    def with_xla(self, xla: XlaMemory) -> Report:
        return replace(self, xla=xla)

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "mesh": dict(self.mesh),
            "values": [v.to_json() for v in self.values],
            "results": [v.to_json() for v in self.results],
            "collectives": [c.to_json() for c in self.collectives],
            "bytes_communicated_per_device": self.bytes_communicated,
            "replicated_ops": [r.to_json() for r in self.replicated_ops],
            "core_stage_available": self.core_available,
            "conflicts": [_conflict_json(c) for c in self.conflicts],
            "memory": self.memory.to_json(),
            "xla_memory": None if self.xla is None else self.xla.to_json(),
        }

    def summary(self) -> list[tuple[str, str]]:
        mesh = ", ".join(f"{a}={n}" for a, n in self.mesh.items()) or "none"
        unknown = sum(v.properties is None for v in self.values)
        m = self.memory
        lines = [
            ("stage", f"{self.stage} (mesh {mesh})"),
            ("values", f"{len(self.values)} ({unknown} of unknown distribution)"),
            ("collectives", f"{len(self.collectives)}, {self.bytes_communicated} B "
                            "communicated per device"),
            ("arguments", f"{m.arguments} B per device"),
            ("peak estimate", f"{m.peak} B per device = arguments + {m.peak_intermediates} B "
                              f"live intermediates (at {m.peak_at}); no fusion or reuse"),
        ]
        if self.xla is not None:
            x = self.xla
            lines.append(("XLA", f"arguments {x.arguments} B + temporaries {x.temporaries} B = "
                                 f"{x.arguments_and_temporaries} B per device; outputs "
                                 f"{x.outputs} B, aliased {x.aliased} B, total {x.total} B"))
        lines += [
            ("conflicts", str(len(self.conflicts))),
            ("replicated ops", f"{len(self.replicated_ops)} core-stage ops outside every loop"
                               + _counts(r.reason for r in self.replicated_ops)
                               if self.core_available else "unknown (no core stage given)"),
        ]
        return lines

    def tables(self) -> list[Table]:
        """The report's sections as tables: summary first, then the details."""
        out = [Table("summary", ("", ""), self.summary())]
        sharding_headers = ("name", "partir.name", "global", "sharding", "local", "bytes")
        out.append(Table("arguments and results", sharding_headers, [
            (v.name, v.partir_name or "", _type_text(v.global_shape, v.dtype), v.sharding,
             _type_text(v.local_shape, v.dtype), str(v.bytes_per_device))
            for v in (*self.arguments, *self.results)
        ]))
        out.append(Table("collectives", (
            "name", "kind", "axes", "operand", "result", "bytes", "needed by", "caused by"), [
            (c.name, c.kind, ",".join(c.axes), c.operand, c.result, str(c.bytes_per_device),
             c.needed_by or "", c.cause)
            for c in self.collectives
        ]))
        if self.conflicts:
            out.append(Table("conflicts", ("op", "axis", "values", "winner", "loser", "detail"), [
                (c.op, c.axis, ", ".join(c.values), c.winner, c.loser, c.detail)
                for c in self.conflicts
            ]))
        if self.replicated_ops:
            out.append(Table("replicated ops (core stage)", ("name", "op", "reason", "detail"), [
                (r.name, r.op, r.reason, r.detail) for r in self.replicated_ops
            ]))
        out.append(Table("values", ("name", "op", "global", "sharding", "local", "bytes"), [
            (v.name, v.op, _type_text(v.global_shape, v.dtype), v.sharding,
             _type_text(v.local_shape, v.dtype), str(v.bytes_per_device))
            for v in self.values
        ]))
        return out

    def to_text(self) -> str:
        return render_plain(self.tables())

    def __str__(self) -> str:
        return self.to_text()


# --------------------------------------------------------------------------
# Building it
# --------------------------------------------------------------------------


def parse_module(text: str, filename: str = "<string>") -> ModuleOp:
    """Parse MLIR text with partir's context and parser (raises xDSL's ParseError).

    Unregistered ops are allowed: the importer keeps ops xDSL does not model
    (`stablehlo.sort`, ...) as such, and the stages print them generically."""
    return PartirParser(make_context(allow_unregistered=True), text, filename).parse_module()


def build_report(module: ModuleOp, core: ModuleOp | None = None) -> Report:
    """The report of `module` (any stage; not modified). `core` is the core
    stage the SPMD `module` was lowered from, for `replicated_ops`; a
    core-stage `module` is its own."""
    entry = entry_function(module)
    if is_spmd(entry):
        stage, spmd = "spmd", module
    else:
        has_loops = any(isinstance(op, LoopOp) for op in entry.body.block.ops)
        stage = "core" if has_loops else "stablehlo"
        if find_mesh(entry) is not None:
            core = module
        spmd = module.clone()
        if find_mesh(entry_function(spmd)) is None:
            spmd.body.block.insert_op_before(MeshOp({}), spmd.body.block.first_op)
        lower_to_spmd(spmd)
    mesh_op = find_mesh(entry_function(spmd))
    mesh = mesh_op.axes if mesh_op is not None else {}
    conflicts = recorded_conflicts(module)
    names = ssa_names(spmd)
    spmd_entry = entry_function(spmd)
    values = _values(spmd_entry, names, mesh)
    return Report(
        stage=stage,
        mesh=mesh,
        values=list(values.values()),
        results=_results(spmd_entry, mesh),
        collectives=_collectives(spmd, names),
        replicated_ops=[] if core is None else replicated_ops(core, conflicts),
        conflicts=conflicts,
        memory=estimate_memory(spmd_entry, values, names),
        core_available=core is not None or stage == "stablehlo",
    )


def report_text(text: str, filename: str = "<string>") -> Report:
    return build_report(parse_module(text, filename))


def is_spmd(entry: func.FuncOp) -> bool:
    return any(isinstance(a.type, DTensorType) for a in entry.body.block.args) or any(
        op.name in _SPMD_OPS for op in entry.body.block.ops
    )


def ssa_names(module: ModuleOp) -> dict[SSAValue, str]:
    """Each value's name as the printer spells it (`%x_1`, `%42`): the names in
    the stage text. xDSL's Printer keeps the map it builds while printing."""
    printer = Printer(stream=StringIO())
    printer.print_op(module)
    return {v: f"%{n}" for v, n in printer._ssa_values.items()}


def properties(dtensor: DTensorType, mesh: dict[str, int]) -> dict[str, str]:
    """DistPar's property of each mesh axis for a distributed value."""
    props = {}
    for axis in mesh:
        split = [d for d, axes in enumerate(dtensor.dim_axes) if axis in axes]
        props[axis] = f"S({split[0]})" if split else "P" if axis in dtensor.partial_axes else "B"
    return props


def _value_info(name: str, op: str, partir_name: str | None, local: Attribute,
                dist: Attribute | None, mesh: dict[str, int]) -> ValueInfo | None:
    if isinstance(local, DTensorType):
        dist, local = local, local.local_type(mesh)
    if not isinstance(local, TensorType):
        return None
    info = ValueInfo(name, op, partir_name, str(local.element_type),
                     tuple(local.get_shape()), tensor_bytes(local))
    if not isinstance(dist, DTensorType):
        return info
    return replace(info, global_shape=tuple(dist.global_type.get_shape()),
                   dim_axes=dist.dim_axes, partial_axes=dist.partial_axes,
                   properties=properties(dist, mesh))


def _partir_name(attrs: DictionaryAttr | None) -> str | None:
    entry = attrs.data.get(NAME_ATTR) if attrs is not None else None
    return entry.data if isinstance(entry, StringAttr) else None


def _values(entry: func.FuncOp, names: dict[SSAValue, str],
            mesh: dict[str, int]) -> dict[SSAValue, ValueInfo]:
    """Arguments, then each top-level op's results, in program order."""
    arg_attrs = list(entry.arg_attrs.data) if entry.arg_attrs else []
    out: dict[SSAValue, ValueInfo] = {}
    for i, arg in enumerate(entry.body.block.args):
        attrs = arg_attrs[i] if i < len(arg_attrs) else None
        info = _value_info(names.get(arg, f"%arg{i}"), "argument", _partir_name(attrs),
                           arg.type, None, mesh)
        if info is not None:
            out[arg] = info
    for n, op in enumerate(entry.body.block.ops):
        for r in op.results:
            dist = op.attributes.get(DIST) if len(op.results) == 1 else None
            info = _value_info(names.get(r, f"%{n}"), op_name(op), None, r.type, dist, mesh)
            if info is not None:
                out[r] = info
    return out


def _results(entry: func.FuncOp, mesh: dict[str, int]) -> list[ValueInfo]:
    res_attrs = list(entry.res_attrs.data) if entry.res_attrs else []
    out = []
    for i, ty in enumerate(entry.function_type.outputs.data):
        name = _partir_name(res_attrs[i] if i < len(res_attrs) else None)
        info = _value_info(name or f"result {i}", "result", name, ty, None, mesh)
        if info is not None:
            out.append(info)
    return out


def _collectives(module: ModuleOp, names: dict[SSAValue, str]) -> list[CollectiveInfo]:
    out = []
    for c in collectives(module):
        needed = c.op.attributes.get(NEEDED_BY)
        origin = c.op.attributes.get(ORIGIN)
        known = isinstance(origin, OriginAttr)
        out.append(CollectiveInfo(
            names.get(c.op.results[0], c.op.name), c.kind, c.axes, c.operand, c.result,
            c.bytes_per_device, needed.data if isinstance(needed, StringAttr) else None,
            origin.action.data if known else None,
            origin.tactic.data if known else None,
            (origin.value.data or None) if known else None,
        ))
    return out


# --------------------------------------------------------------------------
# Ops left replicated
# --------------------------------------------------------------------------


def replicated_ops(core: ModuleOp, conflicts: Sequence[Conflict]) -> list[ReplicatedOp]:
    """The ops of a core-stage module outside every loop, each with its reason."""
    entry = entry_function(core)
    names = ssa_names(core)
    arg_names = _arg_names(entry)
    mesh_op = find_mesh(entry)
    mesh = mesh_op.axes if mesh_op is not None else {}
    out = []
    for n, op in enumerate(entry.body.block.ops):
        if isinstance(op, LoopOp | MeshOp | func.ReturnOp):
            continue
        name = names.get(op.results[0], f"%{n}") if op.results else op.name
        rule = rule_for(op)
        if rule is None:
            out.append(ReplicatedOp(name, op_name(op), OPAQUE, opaque_reason(op)))
            continue
        tilings = [(i, t) for i, v in enumerate(op.operands) for t in visible_tilings(v)]
        conflict = _conflict_at(op, tilings, arg_names, conflicts)
        if conflict is not None:
            out.append(ReplicatedOp(name, op.name, CONFLICT, str(conflict), conflict))
        elif tilings:
            out.append(ReplicatedOp(name, op.name, BLOCKED, _why_blocked(rule, tilings, mesh)))
        else:
            out.append(ReplicatedOp(name, op.name, UNTILED, "no tiled operand reached it"))
    return out


def _arg_names(entry: func.FuncOp) -> dict[SSAValue, str]:
    attrs = list(entry.arg_attrs.data) if entry.arg_attrs else []
    out = {}
    for arg, a in zip(entry.body.block.args, attrs, strict=False):
        name = _partir_name(a)
        if name is not None:
            out[arg] = name
    return out


def _conflict_at(op: Operation, tilings: list[tuple[int, Tiling]],
                 arg_names: dict[SSAValue, str],
                 conflicts: Sequence[Conflict]) -> Conflict | None:
    """The conflict record naming `op`: same op kind, and one of the values it
    names reaches an operand (as an argument or through a tiling's action)."""
    reaching = {arg_names[v] for v in op.operands
                if isinstance(v, BlockArgument) and v in arg_names}
    reaching |= {t.origin.value.data for _, t in tilings if t.origin is not None}
    return next((c for c in conflicts if c.op == op.name and reaching & set(c.values)), None)


def _why_blocked(rule: OpRule, tilings: list[tuple[int, Tiling]], mesh: dict[str, int]) -> str:
    reasons = []
    for i, t in tilings:
        where = f'operand {i} is tiled on dim {t.dim} over "{t.axis}"'
        factor = rule.operand_factor(i, t.dim) if t.dim < len(rule.operands[i]) else None
        why = ("the dimension runs over no factor of the op" if factor is None
               else rule.why_not_tileable(factor, mesh.get(t.axis, 1)))
        reasons.append(f"{where}: {why or 'tileable, but propagation has not moved it'}")
    return "; ".join(dict.fromkeys(reasons))


# --------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------


def estimate_memory(entry: func.FuncOp, infos: dict[SSAValue, ValueInfo],
                    names: dict[SSAValue, str]) -> MemoryEstimate:
    """See `MemoryEstimate`: liveness over the flat SPMD body."""
    ops = list(entry.body.block.ops)
    end = len(ops)
    position = {op: i for i, op in enumerate(ops)}
    arguments = sum(infos[a].bytes_per_device for a in entry.body.block.args if a in infos)
    delta = [0] * (end + 1)
    for i, op in enumerate(ops):
        if isinstance(op, ToLocalOp | FromLocalOp):
            continue
        for r in op.results:
            info = infos.get(r)
            if info is None:
                continue
            last = max((_last_use(u.operation, position, end) for u in r.uses), default=i)
            delta[i] += info.bytes_per_device
            delta[last + 1] -= info.bytes_per_device
    live, peak, peak_at = 0, 0, "no intermediates"
    for i, op in enumerate(ops):
        live += delta[i]
        if live > peak:
            peak, peak_at = live, _op_label(op, names)
    return MemoryEstimate(arguments, peak, peak_at)


def _last_use(user: Operation, position: dict[Operation, int], end: int) -> int:
    """Where a use ends: at its top-level op; a result (`from_local`) at the end."""
    while user not in position and user.parent_op() is not None:
        user = user.parent_op()  # type: ignore[assignment]
    if isinstance(user, FromLocalOp | func.ReturnOp):
        return end - 1
    return position.get(user, end - 1)


def _op_label(op: Operation, names: dict[SSAValue, str]) -> str:
    return f"{names.get(op.results[0], '?')} ({op_name(op)})" if op.results else op_name(op)


# --------------------------------------------------------------------------
# Diff
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardingChange:
    """One argument or result (by `partir.name`) in two reports."""

    kind: str
    name: str
    before: str
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "before": self.before,
                "after": self.after, "changed": self.changed}


@dataclass(frozen=True)
class Diff:
    """How the arguments' and results' shardings differ between two reports."""

    before: str
    after: str
    rows: list[ShardingChange]

    @property
    def changed(self) -> list[ShardingChange]:
        return [r for r in self.rows if r.changed]

    def table(self) -> Table:
        return Table(f"shardings: {self.before} -> {self.after}",
                     ("", "kind", "partir.name", self.before, self.after),
                     [("*" if r.changed else "", r.kind, r.name, r.before, r.after)
                      for r in self.rows])

    def to_json(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after,
                "rows": [r.to_json() for r in self.rows]}

    @property
    def footer(self) -> str:
        return f"{len(self.changed)} of {len(self.rows)} changed"

    def to_text(self) -> str:
        return render_plain([self.table()]) + self.footer + "\n"


ABSENT = "absent"


def diff(a: Report, b: Report, labels: tuple[str, str] | None = None) -> Diff:
    """Per argument and result, matched by `partir.name`, the sharding in each."""
    rows = []
    for kind, left, right in (("argument", a.arguments, b.arguments),
                              ("result", a.results, b.results)):
        lmap = {v.partir_name or v.name: v.sharding for v in left}
        rmap = {v.partir_name or v.name: v.sharding for v in right}
        for name in dict.fromkeys([*lmap, *rmap]):
            rows.append(ShardingChange(kind, name, lmap.get(name, ABSENT),
                                       rmap.get(name, ABSENT)))
    before, after = labels or (a.stage, b.stage)
    return Diff(before, after, rows)


# --------------------------------------------------------------------------
# Plain text
# --------------------------------------------------------------------------


def render_plain(tables: Iterable[Table]) -> str:
    """Tables as aligned columns (what `partir-inspect` prints when piped)."""
    parts = []
    for t in tables:
        rows = [t.headers, *t.rows] if any(t.headers) else list(t.rows)
        widths = [max(len(r[c]) for r in rows) for c in range(len(t.headers))]
        lines = [f"== {t.title} =="]
        for k, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                         .rstrip())
            if k == 0 and any(t.headers):
                lines.append("  ".join("-" * w for w in widths))
        if not t.rows:
            lines.append("(none)")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def dumps(data: Report | Diff) -> str:
    return json.dumps(data.to_json(), indent=2)


def _counts(items: Iterable[str]) -> str:
    counts = Counter(items)
    return f" ({', '.join(f'{n} {k}' for k, n in counts.items())})" if counts else ""


def _list(items: Sequence[Any] | None) -> list[Any] | None:
    return None if items is None else list(items)


def _type_text(shape: Sequence[int] | None, dtype: str) -> str:
    if shape is None:
        return UNKNOWN
    return "x".join([*map(str, shape), dtype])


def _conflict_json(c: Conflict) -> dict[str, Any]:
    return {"op": c.op, "axis": c.axis, "values": list(c.values), "winner": c.winner,
            "loser": c.loser, "detail": c.detail}


__all__ = [
    "CollectiveInfo",
    "Diff",
    "MemoryEstimate",
    "ReplicatedOp",
    "Report",
    "ShardingChange",
    "Table",
    "ValueInfo",
    "XlaMemory",
    "build_report",
    "diff",
    "dumps",
    "parse_module",
    "render_plain",
    "report_text",
]

