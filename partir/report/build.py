"""Building a report from a module at any stage (see the package docstring)."""

from __future__ import annotations

from dataclasses import replace

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects.context import make_context
from dialects.dtypes import tensor_bytes
from dialects.functions import entry_function
from dialects.locations import source_location
from dialects.mesh import Mesh
from dialects.names import op_name
from dialects.parser import PartirParser
from dialects.partir import ORIGIN, LoopOp, OriginAttr, find_mesh
from dialects.spmd import DTensorType, result_dtensors
from dialects.stablehlo_ext import PadOp
from lowering.collectives import collectives
from lowering.distributions import NEEDED_BY
from partir.cost.estimate import estimate
from partir.cost.memory import estimate_memory, local_type
from partir.cost.profile import Profile
from partir.report.model import Report
from partir.report.names import _partir_name, ssa_names
from partir.report.pipeline import PipelineSection
from partir.report.replicated import replicated_ops
from partir.report.rows import CollectiveInfo, PaddedValue, ValueInfo
from partir.selections import recorded_selections
from partir.spmd_form import spmd_form
from rewrites.conflicts import recorded_conflicts
from rewrites.padding import PADDED


def parse_module(text: str, filename: str = "<string>") -> ModuleOp:
    """Parse MLIR text with partir's context and parser (raises xDSL's ParseError).

    Unregistered ops are allowed: the importer keeps ops xDSL does not model
    (`stablehlo.sort`, ...) as such, and the stages print them generically."""
    return PartirParser(make_context(allow_unregistered=True), text, filename).parse_module()


def build_report(
    module: ModuleOp, core: ModuleOp | None = None, profile: Profile | None = None
) -> Report:
    """The report of `module` (any stage; not modified). `core` is the core
    stage the SPMD `module` was lowered from, for `replicated_ops`; a
    core-stage `module` is its own. With `profile`, the predicted step on it
    (`partir.cost.estimate`)."""
    entry = entry_function(module)
    spmd = spmd_form(module)
    if spmd is module:
        stage = "spmd"
    else:
        has_loops = any(isinstance(op, LoopOp) for op in entry.body.block.ops)
        stage = "core" if has_loops else "stablehlo"
        if find_mesh(entry) is not None:
            core = module
    mesh_op = find_mesh(entry_function(spmd))
    mesh = mesh_op.mesh if mesh_op is not None else Mesh.single_device()
    conflicts = recorded_conflicts(module)
    names = ssa_names(spmd)
    spmd_entry = entry_function(spmd)
    values = _values(spmd_entry, names, mesh)
    sizes = {value: info.bytes_per_device for value, info in values.items()}
    memory = estimate_memory(spmd_entry, sizes, names)
    predicted = None if profile is None else estimate(spmd, profile)
    return Report(
        stage=stage,
        mesh=mesh,
        values=list(values.values()),
        results=_results(spmd_entry, mesh),
        collectives=_collectives(spmd, names),
        replicated_ops=[] if core is None else replicated_ops(core, conflicts),
        conflicts=conflicts,
        memory=memory,
        core_available=core is not None or stage == "stablehlo",
        padding=_padding(spmd_entry, names),
        selections=recorded_selections(module) or (recorded_selections(core) if core else []),
        estimate=predicted,
        pipeline=PipelineSection.of(module),
    )


def report_text(text: str, filename: str = "<string>") -> Report:
    return build_report(parse_module(text, filename))


def _value_info(
    name: str,
    op: str,
    partir_name: str | None,
    local: Attribute,
    dist: Attribute | None,
    mesh: Mesh,
) -> ValueInfo | None:
    if isinstance(local, DTensorType):
        dist, local = local, local_type(local, mesh)
    if not isinstance(local, TensorType):
        return None
    info = ValueInfo(
        name,
        op,
        partir_name,
        str(local.element_type),
        tuple(local.get_shape()),
        tensor_bytes(local),
    )
    if not isinstance(dist, DTensorType):
        return info
    return replace(
        info,
        global_shape=tuple(dist.global_type.get_shape()),
        distribution=dist.distribution,
        mesh_axes=tuple(mesh),
    )


def _values(
    entry: func.FuncOp, names: dict[SSAValue, str], mesh: Mesh
) -> dict[SSAValue, ValueInfo]:
    """Arguments, then each top-level op's results, in program order."""
    arg_attrs = list(entry.arg_attrs.data) if entry.arg_attrs else []
    out: dict[SSAValue, ValueInfo] = {}
    for i, arg in enumerate(entry.body.block.args):
        attrs = arg_attrs[i] if i < len(arg_attrs) else None
        info = _value_info(
            names.get(arg, f"%arg{i}"), "argument", _partir_name(attrs), arg.type, None, mesh
        )
        if info is not None:
            out[arg] = info
    for n, op in enumerate(entry.body.block.ops):
        for r, dist in zip(op.results, result_dtensors(op), strict=True):
            info = _value_info(names.get(r, f"%{n}"), op_name(op), None, r.type, dist, mesh)
            if info is not None:
                out[r] = info
    return out


def _results(entry: func.FuncOp, mesh: Mesh) -> list[ValueInfo]:
    res_attrs = list(entry.res_attrs.data) if entry.res_attrs else []
    out = []
    for i, ty in enumerate(entry.function_type.outputs.data):
        name = _partir_name(res_attrs[i] if i < len(res_attrs) else None)
        info = _value_info(name or f"result {i}", "result", name, ty, None, mesh)
        if info is not None:
            out.append(info)
    return out


def _padding(entry: func.FuncOp, names: dict[SSAValue, str]) -> list[PaddedValue]:
    """The pads `rewrites.padding` inserted (they carry `PADDED`), by the
    value they pad."""
    arg_attrs = list(entry.arg_attrs.data) if entry.arg_attrs else []
    out = []
    for op in entry.walk():
        parts = op.attributes.get(PADDED)
        if not isinstance(op, PadOp) or not isinstance(parts, IntegerAttr):
            continue
        source = op.operand
        if isinstance(source.owner, Operation) and source.owner.name == "spmd.to_local":
            source = source.owner.operands[0]  # the argument it localises
        partir_name = None
        if isinstance(source, BlockArgument) and source.index < len(arg_attrs):
            partir_name = _partir_name(arg_attrs[source.index])
        before = op.operand.type
        after = op.result.type
        assert isinstance(before, TensorType) and isinstance(after, TensorType)
        dims = tuple(
            (d, n, p)
            for d, (n, p) in enumerate(zip(before.get_shape(), after.get_shape(), strict=True))
            if n != p
        )
        out.append(PaddedValue(names.get(source, "?"), partir_name, dims, parts.value.data))
    return out


def _collectives(module: ModuleOp, names: dict[SSAValue, str]) -> list[CollectiveInfo]:
    out = []
    for c in collectives(module):
        needed = c.op.attributes.get(NEEDED_BY)
        attr = c.op.attributes.get(ORIGIN)
        origin = attr if isinstance(attr, OriginAttr) else None
        where = source_location(c.op.location)
        out.append(
            CollectiveInfo(
                names.get(c.op.results[0], c.op.name),
                c.kind,
                c.axes,
                c.operand,
                c.result,
                c.bytes_per_device,
                needed.data if isinstance(needed, StringAttr) else None,
                origin.action.data if origin is not None else None,
                origin.tactic.data if origin is not None else None,
                (origin.value.data or None) if origin is not None else None,
                _enclosing_loop(c.op, names),
                where.frame,
                where.name_stack,
            )
        )
    return out


def _enclosing_loop(op: Operation, names: dict[SSAValue, str]) -> str | None:
    """The innermost loop whose body runs `op` (`%4 stablehlo.while`), if any."""
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, func.FuncOp):
        if isinstance(parent, shlo.WhileOp):
            first = parent.results[0] if parent.results else None
            name = names.get(first) if first is not None else None
            return f"{name} {parent.name}" if name else parent.name
        parent = parent.parent_op()
    return None
