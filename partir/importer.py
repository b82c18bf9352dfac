"""JAX function -> one flat xDSL `func.func @main` of StableHLO ops.

JAX does the lowering (`jax.jit(fn, keep_unused=True).lower(*args)`), so the
program partir sees is exactly the one XLA would compile. The importer then
inlines JAX's private helper functions and names every argument and result by
its pytree path, e.g. `params['w1']` or `result[1]['w1']`, kept in the
`partir.name` argument/result attribute: tactics select values by these names.
"""

from __future__ import annotations

import functools
import inspect
import io
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.interpreters import mlir
from jaxlib.mlir import ir
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute

from dialects.context import make_context
from dialects.errors import PartirTypeError
from dialects.functions import NAME_ATTR, entry_function
from dialects.heap import paused_gc
from dialects.locations import source_location
from dialects.manual_regions import normalize_manual_regions
from dialects.sdy import SHARDING, ManualComputationOp
from lowering.emittable import refuse_unemittable
from partir.mlir_bridge import AttributeCache, MlirToXdsl
from partir.selectors import POSITIONAL_ROOT
from rewrites.inline_calls import InlineCallsPass


@dataclass(frozen=True)
class ImportSource:
    """What importing a program again takes: JAX's StableHLO module as MLIR
    bytecode (exact, locations too; a third of a MiB at 24 layers, where a
    copy of the imported xDSL module held 20 MiB and took 0.4 s to make), and
    what the importer attaches to it. `Lowered` keeps this, not a copy of the
    import, and imports again only when its stages are read."""

    bytecode: bytes
    explicit: tuple[bool, ...]
    """Per argument leaf, whether its type carries its sharding (`drop_placements`)."""
    argument_names: tuple[str, ...]
    result_names: tuple[str, ...]
    supported_only: bool = False

    def module(self, mlir_module: Any = None) -> ModuleOp:
        """The imported program: of `mlir_module` (what `bytecode` holds) if
        given, else of `bytecode` parsed again; each call a module of its own."""
        if mlir_module is None:
            mlir_module = ir.Module.parse(self.bytecode, context=mlir.make_ir_context())
        module = import_lowered(mlir_module, supported_only=self.supported_only)
        entry = entry_function(module)
        drop_placements(entry, self.explicit)
        name_arguments(entry, list(self.argument_names))
        name_results(entry, list(self.result_names))
        return module


@dataclass(frozen=True)
class Imported:
    """An imported program and the pytree structure of its results (which
    `partir.jit` rebuilds the outputs with; JAX's lowering already knows it)."""

    module: ModuleOp
    out_tree: Any
    source: ImportSource


def import_program(fn: Callable[..., Any], *args: Any, supported_only: bool = False) -> Imported:
    """Lower `fn` at `args` with JAX and import it as partir's input IR.

    Errors from JAX (a function that does not trace or lower) propagate
    unchanged. Arguments are the same as for calling `fn`; they may be arrays
    or `jax.ShapeDtypeStruct`s (anything else is a `PartirTypeError`). With
    `supported_only`, an op partir cannot emit is refused here, naming the
    op, the user's source line and the nearest supported alternative
    (`lowering.emittable`), before any partitioning work.
    """
    check_arguments(fn, args)
    lowered = jax.jit(uncached(fn), keep_unused=True).lower(*args)
    mlir_module = lowered.compiler_ir("stablehlo")
    assert mlir_module is not None  # JAX lowers to StableHLO
    bytecode = io.BytesIO()
    mlir_module.operation.write_bytecode(bytecode)
    source = ImportSource(
        bytecode.getvalue(),
        tuple(_explicit(leaf) for leaf in jax.tree_util.tree_leaves(list(args))),
        tuple(argument_paths(fn, args)),
        tuple(result_paths(lowered.out_info)),
        supported_only,
    )
    module = source.module(mlir_module)
    return Imported(module, jax.tree_util.tree_structure(lowered.out_info), source)


def uncached(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as a function object of its own, so that JAX's trace and lowering
    caches, which hold entries while their function lives, let go of this
    program's once it is imported (partir.jit caches its own compiled step;
    at 24 layers those entries held 15 MiB)."""

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        return fn(*args)

    return traced


def import_jax(fn: Callable[..., Any], *args: Any) -> ModuleOp:
    """The module of `import_program(fn, *args)`."""
    return import_program(fn, *args).module


_CONTEXT = make_context()
_ATTRIBUTES = AttributeCache(_CONTEXT)


def import_lowered(mlir_module: Any, *, supported_only: bool = False) -> ModuleOp:
    """Convert a jaxlib StableHLO module to xDSL and inline its calls
    (then refuse ops partir cannot emit, with `supported_only`, each with the
    user's line: an op of a private helper such as `jnp.sort`'s has the line
    of its call once inlined)."""
    converter = MlirToXdsl(_CONTEXT, _ATTRIBUTES, internal=is_partir_file)
    with paused_gc():
        module = converter.convert_module(mlir_module)
        InlineCallsPass().apply(_CONTEXT, module)
        if ManualComputationOp.name in converter.op_names:  # a nested jax.shard_map
            normalize_manual_regions(module)
    if supported_only:
        refuse_unemittable(module, lambda op: source_location(op.location).frame)
    return module


_PARTIR_DIRS = tuple(
    str(Path(__file__).resolve().parents[1] / package) + os.sep
    for package in ("partir", "dialects", "lowering", "rewrites")
)


def is_partir_file(path: str) -> bool:
    """Whether a frame's file is partir's own: JAX places the ops it derives
    (e.g. by `jax.grad`) at the call that lowered the function, which is
    partir's importer, not the user's code."""
    return os.path.abspath(path).startswith(_PARTIR_DIRS)


def check_arguments(fn: Callable[..., Any], args: Sequence[Any]) -> None:
    """Every argument leaf is an array (or a number, or a ShapeDtypeStruct):
    what partir can split and pass to devices. Says which leaf is not."""
    names = _parameter_names(fn, len(args))
    for name, arg in zip(names, args, strict=True):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            problem = _leaf_problem(leaf)
            if problem:
                raise PartirTypeError(
                    f"partir.jit: argument {name}{jax.tree_util.keystr(path)} is {problem}; "
                    "partir passes arrays (NumPy, jax.Array, Python numbers) to the devices: "
                    "make it an array, or close over it (functools.partial) if it is static"
                )


def _leaf_problem(leaf: Any) -> str | None:
    if isinstance(leaf, jax.ShapeDtypeStruct | jax.Array | np.ndarray | np.generic):
        dtype = leaf.dtype
    elif isinstance(leaf, bool | int | float | complex):
        return None
    else:
        return f"{leaf!r:.60} (of type {type(leaf).__name__})"
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return (
            f"a typed PRNG key ({dtype}); pass jax.random.key_data(key) "
            "and rebuild it inside with jax.random.wrap_key_data"
        )
    if not (jax.dtypes.issubdtype(dtype, np.number) or jax.dtypes.issubdtype(dtype, np.bool_)):
        return f"an array of {dtype}, which no device holds"
    return None


def argument_paths(fn: Callable[..., Any], args: Sequence[Any]) -> list[str]:
    """Pytree paths of the flattened arguments, rooted at the parameter names."""
    names = _parameter_names(fn, len(args))
    paths = []
    for name, arg in zip(names, args, strict=True):
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            paths.append(name + jax.tree_util.keystr(path))
    return paths


def result_paths(out_info: Any) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path(out_info)[0]
    return ["result" + jax.tree_util.keystr(path) for path, _ in leaves]


def _parameter_names(fn: Callable[..., Any], count: int) -> list[str]:
    """Positional parameter names of `fn`, or `args[i]` where there are none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for i in range(count):
        if i < len(params) and params[i].kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            names.append(params[i].name)
        else:
            names.append(f"{POSITIONAL_ROOT}[{i}]")
    return names


def _with_name(
    attrs: ArrayAttr[DictionaryAttr] | None, count: int, names: list[str]
) -> ArrayAttr[DictionaryAttr]:
    old: list[Mapping[str, Attribute]] = (
        [d.data for d in attrs.data] if attrs is not None else [{} for _ in range(count)]
    )
    return ArrayAttr(
        [DictionaryAttr({**o, NAME_ATTR: StringAttr(n)}) for o, n in zip(old, names, strict=True)]
    )


def _explicit(leaf: Any) -> bool:
    """Whether the leaf's type carries its sharding (explicit mode: a mesh
    axis of its sharding is `AxisType.Explicit`)."""
    try:
        aval = jax.typeof(leaf)
    except TypeError:
        return False
    mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    return any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def drop_placements(entry: func.FuncOp, explicit: Sequence[bool]) -> None:
    """Remove the `sdy.sharding` JAX writes on an argument only because the
    array was placed that way (`jax.device_put` on an auto-mode mesh): where
    an array happens to live is not part of the program, and partir places
    the arguments itself. An explicit-mode argument's sharding is part of its
    type, and stays (the `Annotations` tactic honours it)."""
    attrs = entry.arg_attrs
    if attrs is None or len(explicit) != len(attrs.data):
        return
    entry.arg_attrs = ArrayAttr(
        [
            d if typed else DictionaryAttr({k: v for k, v in d.data.items() if k != SHARDING})
            for typed, d in zip(explicit, attrs.data, strict=True)
        ]
    )


def name_arguments(entry: func.FuncOp, paths: list[str]) -> None:
    """Attach `partir.name` to each argument and use it as the SSA name hint."""
    args = entry.body.block.args
    if len(paths) != len(args):
        raise ValueError(f"{len(paths)} argument leaves for {len(args)} function arguments")
    entry.arg_attrs = _with_name(entry.arg_attrs, len(args), paths)
    for arg, path in zip(args, paths, strict=True):
        arg.name_hint = ssa_name(path)


def name_results(entry: func.FuncOp, paths: list[str]) -> None:
    count = len(entry.function_type.outputs)
    if len(paths) != count:
        raise ValueError(f"{len(paths)} result leaves for {count} function results")
    entry.res_attrs = _with_name(entry.res_attrs, count, paths)


def ssa_name(path: str) -> str:
    """A readable SSA name for a pytree path: `params['w1']` -> `params_w1`."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", path).strip("_")
    return name if name and not name[0].isdigit() else f"v_{name}"
