"""SPMD module -> one readable Python module that runs it with `jax.shard_map`.

The SPMD dialect already describes what one device does: local StableHLO ops
plus explicit collectives. So the emitter is a one-to-one printer: each op
becomes one `jax.lax` statement, in program order, in functions of bounded
size that `_body` calls in turn (`lowering.jax_parts`: JAX traces long
functions slowly, and repeated layers share one function); the dtensor types
of the arguments and results become `in_specs`/`out_specs`, and `build(mesh)`
wraps `_body` in `jax.jit(jax.shard_map(..., check_vma=True))`, traced with
the objects made before frozen (`_Program`: Python's full collections would
otherwise rescan the partitioner's IR during the trace).

The generated source is self-contained (constants are inlined, large ones as
base64 bytes), deterministic (the same module gives byte-identical text) and
safe: identifiers are generated (`a0`, `v3`, `p0`, `x3`); argument and result
names from the `partir.name` attributes appear only in escaped comments. An op without a
faithful translation raises `UnsupportedOpError` instead of emitting something
approximately right.

Replication is typed, not assumed: JAX's `check_vma` stays on, and every
replication claim the generated code makes is true by construction
(`all_gather(..., to='invarying')`, `psum`).

The emitter is split by idea: `lowering.jax_body` (names, lines,
indentation), `lowering.jax_parts` (the body as calls of parts),
`lowering.jax_ops` (the op table) with the per-op emitters in
`lowering.jax_elementwise`, `lowering.jax_structural`,
`lowering.jax_reductions` and `lowering.jax_collectives`,
`lowering.jax_literals` (dtypes, literals, constants) and `lowering.jax_ir`
(IR accessors and `UnsupportedOpError`). This module is the entry point: the
module-level template (header, specs, `build`, `make_mesh`) and `emit_jax`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute
from xdsl.utils.exceptions import VerifyException

from dialects import spmd
from dialects.functions import entry_function
from dialects.heap import paused_gc
from dialects.mesh import Mesh
from dialects.partir import MeshOp
from lowering.jax_body import BodyEmitter, ModuleTables
from lowering.jax_ir import UnsupportedOpError, element_dtype
from lowering.jax_literals import comment_text, dtype_literal, partition_spec, tuple_literal
from lowering.jax_ops import EMITTERS
from lowering.jax_parts import PartBounds, PartsEmitter

__all__ = ["NAME_ATTR", "SUPPORTED_OPS", "PartBounds", "UnsupportedOpError", "emit_jax"]

NAME_ATTR = "partir.name"
"""Argument/result attribute with the value's pytree path (see `partir.importer`)."""

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(EMITTERS))
"""The op names `emit_jax` translates (anything else raises `UnsupportedOpError`)."""


# --------------------------------------------------------------------------
# The module: specs, body, build/make_mesh


def _mesh(module: ModuleOp) -> Mesh:
    for op in module.body.block.ops:
        if isinstance(op, MeshOp):
            return op.mesh
    raise ValueError("the SPMD module declares no partir.mesh")


def _names(attrs: ArrayAttr[DictionaryAttr] | None, count: int) -> list[str | None]:
    if attrs is None:
        return [None] * count
    names: list[str | None] = []
    for d in attrs.data:
        value = d.data.get(NAME_ATTR)
        names.append(value.data if isinstance(value, StringAttr) else None)
    return names


def _dtensor(entry: func.FuncOp, ty: Attribute, what: str) -> spmd.DTensorType:
    if not isinstance(ty, spmd.DTensorType):
        raise UnsupportedOpError(f"{what} of @{entry.sym_name.data} is {ty}, not !spmd.dtensor")
    if ty.partial_axes:
        raise UnsupportedOpError(
            f"{what} of @{entry.sym_name.data} is {ty}: shard_map cannot pass pending partial sums"
        )
    return ty


def _specs(
    variable: str, types: Sequence[spmd.DTensorType], names: Sequence[str | None], label: str
) -> list[str]:
    """`IN_SPECS = (P(...),  # a0 name: global type ...)`, one line per value."""
    if not types:
        return [f"{variable} = ()"]
    lines = [f"{variable} = ("]
    for i, (ty, name) in enumerate(zip(types, names, strict=True)):
        named = f" {comment_text(name)}" if name else ""
        note = f"  # {label}{i}{named}: {comment_text(str(ty.global_type))}"
        lines.append(f"    {partition_spec(ty.distribution)},{note}")
    return [*lines, ")"]


def _input_types(
    entry: func.FuncOp, types: Sequence[spmd.DTensorType], mesh: Mesh
) -> list[str]:
    """`IN_TYPES`: (dtype, global shape, per-device shape) per input, which
    `_check_inputs` compares with what `_body` is traced with: a wrong but
    divisible input shape would otherwise slice silently wrong parts."""
    lines = ["", "# (dtype, global shape, per-device shape) of each input; checked at trace time."]
    if not types:
        return [*lines, "IN_TYPES = ()"]
    lines.append("IN_TYPES = (")
    for i, ty in enumerate(types):
        try:
            local = ty.local_type(mesh)
        except VerifyException as error:
            raise UnsupportedOpError(f"argument {i} of @{entry.sym_name.data}: {error}") from None
        dtype = dtype_literal(element_dtype(entry, ty.global_type))
        shape = tuple(ty.global_type.get_shape())
        lines.append(f"    ({dtype}, {shape!r}, {tuple(local.get_shape())!r}),  # a{i}")
    return [*lines, ")"]


def _emit_body(
    entry: func.FuncOp, tables: ModuleTables, bounds: PartBounds | None
) -> tuple[BodyEmitter, PartsEmitter]:
    """`_body`'s lines (calls of the parts, the return) and the parts."""
    em = BodyEmitter(tables)
    block = entry.body.block
    for i, arg in enumerate(block.args):
        em.names[arg] = f"a{i}"
    *ops, ret = list(block.ops)
    if not isinstance(ret, func.ReturnOp):
        raise UnsupportedOpError(f"@{entry.sym_name.data} does not end in func.return")
    parts = PartsEmitter(em, tables, bounds)
    parts.emit(ops)
    em.write(f"return {tuple_literal([em.name(v) for v in ret.operands])}")
    return em, parts


_HEADER = """\
# Generated by partir from the SPMD module "{name}"; do not edit.
#
# One shard_map program for the mesh {mesh_text}:
#     mesh = make_mesh()        # or any jax.sharding.Mesh with these axes
#     fn = build(mesh)          # jax.jit(jax.shard_map(_body, ...))
#     outputs = fn(*inputs)     # inputs/outputs are global arrays, in order
{imports}
import contextlib
import gc

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = {axes!r}
MESH_SHAPE = {shape!r}
USES_64BIT_TYPES = {x64!r}
"""

REDUCE_SCATTER_SCOPE = "partir_reduce_scatter"
"""The named scope of `_reduce_scatter`'s sum-then-slice form (CPU), by which
its sum is told from a program's own all-reduces in a jaxpr."""

_FOOTER = '''

def _check_inputs(*args):
    """At trace time: each input's per-device part is what the program was emitted for."""
    for i, (arg, (dtype, shape, local)) in enumerate(zip(args, IN_TYPES, strict=True)):
        if arg.dtype != np.dtype(dtype) or tuple(arg.shape) != local:
            raise TypeError(
                f"input {i}: expected {np.dtype(dtype)}{list(shape)}, i.e. {list(local)} per "
                f"device under {IN_SPECS[i]}; got {arg.dtype}{list(arg.shape)} per device"
            )


REDUCE_SCATTER_AS_SUM = None
"""Whether `_reduce_scatter` sums then slices (True) or scatters (False);
None decides by JAX's default backend when tracing (CPU: sum then slice)."""


def _reduce_scatter(x, axes, dim, size):
    """`x` summed over `axes`, this device keeping its `size` slice along `dim`.

    On CPU as XLA's own partitioner writes it there, the sum then the slice:
    XLA's CPU pipeline combines all-reduces into one collective but not
    reduce-scatters, and each collective is a rendezvous of every device's
    thread (the block step under ZeRO-3 ran 5-8% slower than jax.jit with 16
    reduce-scatters, as fast with them summed this way). The price is a
    full-size sum buffer per scatter, as jax.jit's program has. Elsewhere a
    reduce-scatter, along dim 0 of a view with `dim` moved first: XLA folds
    the transposes into the producer's layout, where a scatter along a minor
    dim costs full-size layout copies.
    """
    as_sum = REDUCE_SCATTER_AS_SUM
    if as_sum is None:
        as_sum = jax.default_backend() == "cpu"
    if as_sum:
        with jax.named_scope("@SCATTER_SCOPE@"):
            start = lax.axis_index(axes) * size
            return lax.dynamic_slice_in_dim(lax.psum(x, axes), start, size, axis=dim)
    if dim == 0:
        return lax.psum_scatter(x, axes, scatter_dimension=0, tiled=True)
    moved = lax.psum_scatter(jnp.moveaxis(x, dim, 0), axes, scatter_dimension=0, tiled=True)
    return jnp.moveaxis(moved, 0, dim)


def make_mesh(devices=None):
    """A mesh of MESH_SHAPE (Auto axes) over the first devices (default: jax.devices())."""
    devices = list(jax.devices() if devices is None else devices)
    needed = int(np.prod(MESH_SHAPE))
    if len(devices) < needed:
        raise ValueError(
            f"the mesh {dict(zip(MESH_AXES, MESH_SHAPE))} needs {needed} devices, "
            f"but only {len(devices)} are available"
        )
    grid = np.array(devices[:needed], dtype=object).reshape(MESH_SHAPE)
    return jax.sharding.Mesh(
        grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    )


def _check_mesh(mesh):
    if tuple(mesh.axis_names) != MESH_AXES:
        raise ValueError(f"expected mesh axes {MESH_AXES}, got {tuple(mesh.axis_names)}")
    shape = tuple(mesh.shape[a] for a in MESH_AXES)
    if shape != MESH_SHAPE:
        raise ValueError(f"expected mesh shape {MESH_SHAPE}, got {shape}")


def input_shardings(mesh):
    """NamedShardings to device_put the inputs with (optional: build() takes any layout)."""
    _check_mesh(mesh)
    return tuple(NamedSharding(mesh, spec) for spec in IN_SPECS)


def output_shardings(mesh):
    _check_mesh(mesh)
    return tuple(NamedSharding(mesh, spec) for spec in OUT_SPECS)


def build(mesh):
    """The program as one jitted callable on `mesh`: global inputs -> tuple of
    outputs, with jax.jit's `.trace` and `.lower` (`_Program`)."""
    _check_mesh(mesh)
    fn = jax.jit(
        jax.shard_map(
            _body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS, check_vma=True
        )
    )
    return _Program(fn, wide=USES_64BIT_TYPES and not jax.config.jax_enable_x64)


class _Program:
    """`fn` (jax.jit of the shard_map), called, traced and lowered:

    - with 64-bit types on if `wide`: JAX lowered the program with them inside
      (e.g. jax.random's counters) although x64 mode is off, and jax.jit ran the
      original so (without, jnp.uint64 would silently be 32 bits);
    - when tracing (`.trace`, `.lower`, the first call), with the objects made
      before left out of Python's garbage collections (unless the caller froze
      objects itself): the trace makes objects per op, and each full collection
      would walk every older object too (the partitioner's IR, a model), at 24
      layers half the trace.
    """

    def __init__(self, fn, wide):
        self.fn, self.wide, self.traced = fn, wide, False

    def __call__(self, *args):
        if self.traced and not self.wide:
            return self.fn(*args)
        with self._running(tracing=not self.traced):
            outputs = self.fn(*args)
        self.traced = True
        return outputs

    def trace(self, *args):
        with self._running(tracing=True):
            return _Traced(self, self.fn.trace(*args))

    def lower(self, *args):
        with self._running(tracing=True):
            return self.fn.lower(*args)

    @contextlib.contextmanager
    def _running(self, tracing):
        with contextlib.ExitStack() as stack:
            if self.wide:
                stack.enter_context(jax.enable_x64(True))
            if tracing and not gc.get_freeze_count():
                gc.freeze()
                stack.callback(gc.unfreeze)
            yield


class _Traced:
    """JAX's traced program, lowered as `_Program` traces: lowering makes
    objects per equation too (at 96 layers a full collection came due in it
    and took most of its 5 s)."""

    def __init__(self, program, traced):
        self._program, self._traced = program, traced

    def lower(self, *args, **kwargs):
        with self._program._running(tracing=True):
            return self._traced.lower(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._traced, name)
'''.replace("@SCATTER_SCOPE@", REDUCE_SCATTER_SCOPE)

_WIDE = {np.dtype(t) for t in (np.float64, np.int64, np.uint64, np.complex128)}


def emit_jax(
    module: ModuleOp, *, name: str = "partir_program", part_bounds: PartBounds | None = None
) -> str:
    """The source of a Python module running the SPMD `module` with `jax.shard_map`,
    its body cut into functions as `part_bounds` says (default `PartBounds()`).

    Raises `UnsupportedOpError` for an op or type with no faithful translation.
    """
    mesh = _mesh(module)
    entry = entry_function(module)
    arg_types = [
        _dtensor(entry, t, f"argument {i}") for i, t in enumerate(entry.function_type.inputs)
    ]
    res_types = [
        _dtensor(entry, t, f"result {i}") for i, t in enumerate(entry.function_type.outputs)
    ]
    tables = ModuleTables()
    with paused_gc():
        body, parts = _emit_body(entry, tables, part_bounds)
    element_dtypes = {
        element_dtype(entry, t.global_type) for t in (*arg_types, *res_types)
    } | tables.dtypes
    mesh_text = ", ".join(f"{comment_text(a)}={n}" for a, n in mesh.items())
    out = [
        _HEADER.format(
            imports="\nimport base64\n" if body.constants else "",
            name=comment_text(name),
            mesh_text=mesh_text,
            axes=tuple(mesh),
            shape=tuple(mesh.values()),
            x64=bool(element_dtypes & _WIDE),
        ),
        *_specs("IN_SPECS", arg_types, _names(entry.arg_attrs, len(arg_types)), "a"),
        *_specs("OUT_SPECS", res_types, _names(entry.res_attrs, len(res_types)), "r"),
        *_input_types(entry, arg_types, mesh),
    ]
    if body.constants:
        out += ["", "_CONSTANTS = {"]
        out += [f"    {key!r}: {value}," for key, value in body.constants.items()]
        out += ["}"]
    params = ", ".join(f"a{i}" for i in range(len(arg_types)))
    out += parts.function_lines()
    out += ["", "", f"def _body({params}):", f"    _check_inputs({params})", *body.source()]
    helpers = "".join(f"\n{source}" for _, source in sorted(tables.helpers.items()))
    return "\n".join(out) + "\n" + _FOOTER + helpers
