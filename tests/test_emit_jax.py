"""SPMD module -> generated `jax.shard_map` source, run on the 8 CPU devices.

Every numeric check runs the generated code on a 4x2 mesh: hand-written
modules (one per collective) against NumPy, and replicated versions of the
example programs (and of a zoo of small programs covering the op table)
against `jax.jit` of the original function.
"""

from __future__ import annotations

import gc
import importlib
import io
import linecache
import sys
import tokenize
import traceback
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr, TensorType

import examples
import partir
from dialects import spmd
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.parser import PartirParser
from dialects.partir import MeshOp
from lowering.loader import load_source
from lowering.to_jax import UnsupportedOpError, emit_jax
from tests.numerics import assert_close

MESH_AXES = {"batch": 4, "model": 2}
MESH_DECL = 'partir.mesh @mesh ["batch" = 4, "model" = 2]'


# --------------------------------------------------------------------------
# Helpers


def parse(text: str) -> ModuleOp:
    module = PartirParser(make_context(), text).parse_module()
    module.verify()
    return module


def entry(module: ModuleOp) -> func.FuncOp:
    return next(op for op in module.body.block.ops if isinstance(op, func.FuncOp))


def replicated(module: ModuleOp) -> ModuleOp:
    """A StableHLO module as an SPMD module with every argument and result
    replicated: the same program, run unchanged on each device."""
    block = module.body.block
    block.insert_op_before(MeshOp(MESH_AXES), block.first_op)
    body = entry(module).body.block
    for i in range(len(body.args)):
        old = body.args[i]
        assert isinstance(old.type, TensorType)
        new = body.insert_arg(spmd.DTensorType(old.type, [[]] * old.type.get_num_dims()), i)
        to_local = spmd.ToLocalOp(new, old.type)
        body.insert_op_before(to_local, body.first_op)
        old.replace_all_uses_with(to_local.result)
        body.erase_arg(old)
    ret = body.last_op
    assert isinstance(ret, func.ReturnOp)
    outs = []
    for value in ret.operands:
        dtensor = spmd.DTensorType(value.type, [[]] * value.type.get_num_dims())
        from_local = spmd.FromLocalOp(value, dtensor)
        body.insert_op_before(from_local, ret)
        outs.append(from_local.result)
    ret.operands = outs
    entry(module).update_function_type()
    module.verify()
    return module


def load(module: ModuleOp, name: str = "test_program") -> types.ModuleType:
    return load_source(emit_jax(module, name=name), name)


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    return load(parse(MATMUL)).make_mesh()


def run(module: ModuleOp, mesh: jax.sharding.Mesh, *args: Any) -> list[np.ndarray]:
    return [np.asarray(out) for out in load(module).build(mesh)(*args)]


def ints(*shape: int, seed: int = 0) -> np.ndarray:
    """Small integer-valued floats: sums over devices are exact in any order."""
    return np.random.default_rng(seed).integers(-8, 8, shape).astype(np.float32)


# --------------------------------------------------------------------------
# (a) The hand-written tensor-parallel matmul

MATMUL = """
partir.mesh @mesh ["batch" = 4, "model" = 2]
func.func @main(%x: !spmd.dtensor<16x32xf32, [{"batch"}, {}]>, %w: !spmd.dtensor<32x8xf32, [{"model"}, {}]>) -> !spmd.dtensor<16x8xf32, [{"batch"}, {}]> {
  %xl = spmd.to_local %x : !spmd.dtensor<16x32xf32, [{"batch"}, {}]> -> tensor<4x32xf32>
  %wl = spmd.to_local %w : !spmd.dtensor<32x8xf32, [{"model"}, {}]> -> tensor<16x8xf32>
  %xs = spmd.local_slice %xl dim 1 over ["model"] : tensor<4x32xf32> -> tensor<4x16xf32>
  %p = stablehlo.dot_general %xs, %wl, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  %r = spmd.all_reduce %p over ["model"] : tensor<4x8xf32> -> tensor<4x8xf32>
  %y = spmd.from_local %r : tensor<4x8xf32> -> !spmd.dtensor<16x8xf32, [{"batch"}, {}]>
  func.return %y : !spmd.dtensor<16x8xf32, [{"batch"}, {}]>
}
"""


def test_hand_written_matmul_runs_on_the_mesh() -> None:
    program = load(parse(MATMUL))
    assert program.MESH_AXES == ("batch", "model") and program.MESH_SHAPE == (4, 2)
    assert repr(program.IN_SPECS) == "(P('batch', None), P('model', None))"
    mesh = program.make_mesh()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 32)).astype(np.float32)
    w = rng.normal(size=(32, 8)).astype(np.float32)
    (y,) = program.build(mesh)(x, w)
    expected = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch", None))
    assert y.sharding.is_equivalent_to(expected, 2)
    assert_close(np.asarray(y), x @ w, what="x @ w")


# --------------------------------------------------------------------------
# (b) Each collective alone, against NumPy


def one_op_module(arg: str, arg_local: str, op: str, res_local: str, res: str) -> str:
    """`to_local`, one op on `%xl`, `from_local`: the op's meaning in isolation."""
    arg_t, res_t = f"!spmd.dtensor<{arg}>", f"!spmd.dtensor<{res}>"
    return f"""
{MESH_DECL}
func.func @main(%x: {arg_t}) -> {res_t} {{
  %xl = spmd.to_local %x : {arg_t} -> tensor<{arg_local}>
  %yl = {op} : tensor<{arg_local}> -> tensor<{res_local}>
  %y = spmd.from_local %yl : tensor<{res_local}> -> {res_t}
  func.return %y : {res_t}
}}
"""


BM = '{"batch", "model"}'
MB = '{"model", "batch"}'

COLLECTIVES: dict[str, tuple[str, tuple[int, ...], Callable[[np.ndarray], np.ndarray]]] = {
    "all_reduce": (
        one_op_module(
            '16x8xf32, [{"model"}, {}]',
            "8x8xf32",
            'spmd.all_reduce %xl over ["model"]',
            "8x8xf32",
            "8x8xf32, [{}, {}]",
        ),
        (16, 8),
        lambda x: x[:8] + x[8:],
    ),
    "all_reduce_two_axes": (
        one_op_module(
            f"16x8xf32, [{BM}, {{}}]",
            "2x8xf32",
            'spmd.all_reduce %xl over ["batch", "model"]',
            "2x8xf32",
            "2x8xf32, [{}, {}]",
        ),
        (16, 8),
        lambda x: x.reshape(8, 2, 8).sum(0),
    ),
    "all_gather": (
        one_op_module(
            '16x8xf32, [{"batch"}, {"model"}]',
            "4x4xf32",
            'spmd.all_gather %xl dim 1 over ["model"]',
            "4x8xf32",
            '16x8xf32, [{"batch"}, {}]',
        ),
        (16, 8),
        lambda x: x,
    ),
    "all_gather_two_axes": (
        one_op_module(
            f"16x8xf32, [{BM}, {{}}]",
            "2x8xf32",
            'spmd.all_gather %xl dim 0 over ["batch", "model"]',
            "16x8xf32",
            "16x8xf32, [{}, {}]",
        ),
        (16, 8),
        lambda x: x,
    ),
    "all_gather_model_major": (
        one_op_module(
            f"16x8xf32, [{MB}, {{}}]",
            "2x8xf32",
            'spmd.all_gather %xl dim 0 over ["model", "batch"]',
            "16x8xf32",
            "16x8xf32, [{}, {}]",
        ),
        (16, 8),
        lambda x: x,
    ),
    "reduce_scatter": (
        one_op_module(
            '16x8xf32, [{"model"}, {}]',
            "8x8xf32",
            'spmd.reduce_scatter %xl dim 0 over ["model"]',
            "4x8xf32",
            '8x8xf32, [{"model"}, {}]',
        ),
        (16, 8),
        lambda x: x[:8] + x[8:],
    ),
    "reduce_scatter_of_replicated": (
        # Each of the 8 devices contributes its (identical) copy: 8 * x.
        one_op_module(
            "16x8xf32, [{}, {}]",
            "16x8xf32",
            'spmd.reduce_scatter %xl dim 0 over ["batch", "model"]',
            "2x8xf32",
            f"16x8xf32, [{BM}, {{}}]",
        ),
        (16, 8),
        lambda x: 8 * x,
    ),
    "all_to_all": (
        one_op_module(
            '16x8xf32, [{"model"}, {}]',
            "8x8xf32",
            'spmd.all_to_all %xl split 1 concat 0 over ["model"]',
            "16x4xf32",
            '16x8xf32, [{}, {"model"}]',
        ),
        (16, 8),
        lambda x: x,
    ),
    "all_to_all_two_axes": (
        one_op_module(
            f"16x16xf32, [{BM}, {{}}]",
            "2x16xf32",
            'spmd.all_to_all %xl split 1 concat 0 over ["batch", "model"]',
            "16x2xf32",
            f"16x16xf32, [{{}}, {BM}]",
        ),
        (16, 16),
        lambda x: x,
    ),
    "local_slice": (
        one_op_module(
            '16x8xf32, [{"batch"}, {}]',
            "4x8xf32",
            'spmd.local_slice %xl dim 1 over ["model"]',
            "4x4xf32",
            '16x8xf32, [{"batch"}, {"model"}]',
        ),
        (16, 8),
        lambda x: x,
    ),
    "local_slice_two_axes": (
        one_op_module(
            "16x8xf32, [{}, {}]",
            "16x8xf32",
            'spmd.local_slice %xl dim 0 over ["batch", "model"]',
            "2x8xf32",
            f"16x8xf32, [{BM}, {{}}]",
        ),
        (16, 8),
        lambda x: x,
    ),
    "collective_permute": (
        # read back as the devices' values side by side: each holds its source's part
        one_op_module(
            '16x8xf32, [{"model"}, {}]',
            "8x8xf32",
            'spmd.collective_permute %xl over ["model"] pairs dense<[[0, 1], [1, 0]]> '
            ": tensor<2x2xi64>",
            "8x8xf32",
            '16x8xf32, [{"model"}, {}]',
        ),
        (16, 8),
        lambda x: np.concatenate([x[8:], x[:8]]),
    ),
    "collective_permute_shift_over_two_axes": (
        # positions in the ("batch", "model") group, batch major; position 0 gets zeros
        one_op_module(
            f"16x8xf32, [{BM}, {{}}]",
            "2x8xf32",
            'spmd.collective_permute %xl over ["batch", "model"] '
            "pairs dense<[[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7]]> "
            ": tensor<7x2xi64>",
            "2x8xf32",
            f"16x8xf32, [{BM}, {{}}]",
        ),
        (16, 8),
        lambda x: np.concatenate([np.zeros_like(x[:2]), x[:-2]]),
    ),
}


@pytest.mark.parametrize("case", sorted(COLLECTIVES))
def test_collective_alone(case: str, mesh: jax.sharding.Mesh) -> None:
    text, shape, expected = COLLECTIVES[case]
    x = ints(*shape)
    (y,) = run(parse(text), mesh, x)
    assert_close(y, expected(x), what=case)


SCATTERS = {
    **{case: COLLECTIVES[case] for case in ("reduce_scatter", "reduce_scatter_of_replicated")},
    "reduce_scatter_minor_dim": (
        one_op_module(
            '8x16xf32, [{}, {"model"}]',
            "8x8xf32",
            'spmd.reduce_scatter %xl dim 1 over ["model"]',
            "8x4xf32",
            '8x8xf32, [{}, {"model"}]',
        ),
        (8, 16),
        lambda x: x[:, :8] + x[:, 8:],
    ),
}


@pytest.mark.parametrize("as_sum", [True, False])
@pytest.mark.parametrize("case", sorted(SCATTERS))
def test_both_forms_of_a_reduce_scatter(case: str, as_sum: bool, mesh: jax.sharding.Mesh) -> None:
    """A reduce-scatter runs as a sum then each device's slice (the form
    chosen on CPU) or as XLA's reduce-scatter (elsewhere): the same numbers,
    and the compiled program has the collective it was asked for."""
    text, shape, expected = SCATTERS[case]
    program = load(parse(text))
    program.REDUCE_SCATTER_AS_SUM = as_sum
    x = ints(*shape)
    fn = program.build(mesh)
    (y,) = fn(x)
    assert_close(np.asarray(y), expected(x), what=case)
    hlo = fn.lower(x).compile().as_text()
    assert ("reduce-scatter(" in hlo) is not as_sum
    assert ("all-reduce(" in hlo) is as_sum


# --------------------------------------------------------------------------
# (c) Replicated programs run unchanged on the mesh


def check_replicated(fn: Callable[..., Any], args: tuple, mesh: jax.sharding.Mesh) -> None:
    module = replicated(partir.import_jax(fn, *args))
    got = load(module).build(mesh)(*jax.tree_util.tree_leaves(args))
    ref = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        assert_close(np.asarray(g), np.asarray(r), what=f"leaf {i}")


@pytest.mark.parametrize("name", examples.ALL)
def test_example_program_replicated(name: str, mesh: jax.sharding.Mesh) -> None:
    example = importlib.import_module(f"examples.{name}")
    check_replicated(example.program, tuple(example.make_args()), mesh)


_rng = np.random.default_rng(1)
_X = _rng.normal(size=(8, 16)).astype(np.float32)
_I = _rng.integers(-20, 20, size=(8, 16)).astype(np.int32)
_IDX = _rng.integers(0, 16, size=(8, 3)).astype(np.int32)
_BIG = np.arange(120, dtype=np.float32).reshape(10, 12)
_BIG[3, 4], _BIG[5, 5] = np.nan, -np.inf

# Small programs whose StableHLO covers the op table (each group is one program,
# so one compile).
ZOO: dict[str, tuple[Callable[..., Any], tuple]] = {
    "constants": (
        lambda: (
            jnp.asarray(_BIG),  # > 64 elements: the base64 table
            jnp.asarray(np.array([[1.0, -np.inf], [np.nan, -0.0]], np.float32)),
            jnp.asarray(np.arange(70, dtype=np.int32)),
            jnp.asarray(np.array([True, False, True])),
            jnp.asarray(np.array([0.1, 2.5], dtype=jnp.bfloat16)),
            jnp.full((3,), np.nan, jnp.float32),
        ),
        (),
    ),
    "unary_and_chlo": (
        lambda a: (
            *(f(a) for f in (jnp.abs, jnp.ceil, jnp.floor, jnp.cos, jnp.sin, jnp.expm1)),
            *(f(a) for f in (jax.nn.sigmoid, jnp.sign, jnp.round, lax.round, jnp.cbrt)),
            *(f(a) for f in (jnp.isfinite, jnp.square, lax.erf, lax.erfc, jnp.tan)),
            *(f(a) for f in (jnp.sinh, jnp.cosh, jnp.arcsinh, jnp.isinf)),
            jnp.log1p(jnp.abs(a)),
            jnp.arctan2(a, a + 1),
            lax.lgamma(jnp.abs(a) + 0.5),
            lax.digamma(jnp.abs(a) + 0.5),
            lax.erf_inv(jnp.tanh(a)),
        ),
        (_X,),
    ),
    "integers": (
        lambda a, b: (
            a // 3,
            a % 7,
            a << 2,
            a >> 1,
            lax.shift_right_logical(a, 1),
            a & b,
            a | b,
            a ^ b,
            ~a,
            lax.clamp(-5, a, 5),
            jnp.maximum(a, b),
            jnp.minimum(a, b),
            a**2,
            lax.population_count(a),
            lax.clz(a),
            a.astype(jnp.float32),
            (a > b) & (a != 0),
            jnp.logical_not(a > b),
        ),
        (_I, _I.T.reshape(8, 16)),
    ),
    "movement": (
        lambda a: (
            jnp.pad(a, ((1, 2), (0, 3))),
            lax.pad(a, 0.0, ((1, -1, 1), (0, 0, 0))),
            a[2:6, 1:12:3],
            jnp.concatenate([a, a * 2], axis=1),
            lax.dynamic_slice(a, (jnp.int32(3), jnp.int32(14)), (4, 4)),  # start clamped
            a.T,
            a.reshape(4, 32),
            a[::-1, ::-1],
        ),
        (_X,),
    ),
    "reductions": (
        lambda a, b: (
            jnp.argmax(a, axis=1),  # a two-input reduce: the nested-function path
            jnp.argmin(a, axis=0),
            a.min(axis=1),
            a.prod(axis=0),
            jnp.all(a > 0, axis=1),
            jnp.any(a > 0),
            b.sum(),
            lax.reduce(a, np.float32(1.0), lax.add, (1,)),  # init is not the identity
        ),
        (_X, _I),
    ),
    "gather_and_dot": (
        lambda a, j: (
            jnp.take_along_axis(a, j, axis=1),
            a[:, j[:, 0]],
            a[j[:, 0] % 8, j[:, 1]],
            jnp.einsum("bij,bjk->bik", a.reshape(2, 4, 16), a.T.reshape(2, 16, 4)),
            jnp.dot(a, a.T, precision=lax.Precision.HIGHEST),
            jnp.dot(a.astype(jnp.bfloat16), a.T.astype(jnp.bfloat16)),
        ),
        (_X, _IDX),
    ),
    "mixed": (
        lambda a, k: (
            jnp.where(a > 0, a, jnp.nan),
            jax.nn.softmax(a),
            jax.nn.gelu(a, approximate=False),
            lax.bitcast_convert_type(a, jnp.int32),
            lax.reduce_precision(a, 5, 10),
            jnp.arange(16) * 2,
            k.astype(bool),
        ),
        (_X, _I),
    ),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_op_zoo_replicated(name: str, mesh: jax.sharding.Mesh) -> None:
    fn, args = ZOO[name]
    check_replicated(fn, args, mesh)


def test_nested_reducer_on_sharded_rows(mesh: jax.sharding.Mesh) -> None:
    """argmax's two-input reduce (a nested function in the generated code) on a
    batch-sharded operand with replicated init values: JAX's vma typing must
    accept the mix."""
    fn = lambda a: (jnp.argmax(a, axis=1), a.sum(axis=1))  # noqa: E731
    text = str(replicated(partir.import_jax(fn, np.zeros((8, 16), np.float32))))
    for old, new in [
        ("8x16xf32, [{}, {}]", '32x16xf32, [{"batch"}, {}]'),
        ("8xi32, [{}]", '32xi32, [{"batch"}]'),
        ("8xf32, [{}]", '32xf32, [{"batch"}]'),
    ]:
        text = text.replace(f"!spmd.dtensor<{old}>", f"!spmd.dtensor<{new}>")
    x = np.random.default_rng(2).normal(size=(32, 16)).astype(np.float32)
    index, total = run(parse(text), mesh, x)
    assert_close(index, x.argmax(axis=1).astype(np.int32))
    assert_close(total, x.sum(axis=1))


GATHER = """
func.func @main(%x: tensor<8x4xf32>, %i: tensor<1x5xi32>, %j: tensor<5xi32>) -> (tensor<5x4xf32>, tensor<5x4xf32>) {
  %a = "stablehlo.gather"(%x, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 0>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<8x4xf32>, tensor<1x5xi32>) -> tensor<5x4xf32>
  %b = "stablehlo.gather"(%x, %j) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<8x4xf32>, tensor<5xi32>) -> tensor<5x4xf32>
  func.return %a, %b : tensor<5x4xf32>, tensor<5x4xf32>
}
"""


def test_gather_index_vector_dim_not_last(mesh: jax.sharding.Mesh) -> None:
    """Index vectors in dim 0, or implicit: lax needs them last. Out-of-range
    starts (-3, 11) clamp, as StableHLO says; checked against the interpreter."""
    x = ints(8, 4)
    i = np.array([[0, 7, -3, 11, 2]], np.int32)
    args = (x, i, i[0])
    expected = run_function(parse(GATHER), args)
    got = run(replicated(parse(GATHER)), mesh, *args)
    for g, e in zip(got, expected, strict=True):
        assert_close(g, e)


# --------------------------------------------------------------------------
# (d) Determinism and names


def test_emission_is_deterministic() -> None:
    example = importlib.import_module("examples.mlp_train_step")
    args = example.make_args()
    first = replicated(partir.import_jax(example.program, *args))
    again = replicated(partir.import_jax(example.program, *args))
    assert emit_jax(first) == emit_jax(first) == emit_jax(again)


EVIL = "params['x'] + __import__('os')\nimport os; os.system('boom')\r\u2028\x0c\"\"\"#"


def test_names_appear_only_in_comments(mesh: jax.sharding.Mesh) -> None:
    module = parse(MATMUL)
    main = entry(module)
    evil = DictionaryAttr({"partir.name": StringAttr(EVIL)})
    main.arg_attrs = ArrayAttr([evil, evil])
    main.res_attrs = ArrayAttr([evil])
    source = emit_jax(module, name=EVIL)
    assert source.count("\n") == len(source.splitlines()), "a name broke a line"
    assert source.isascii()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    code = [t.string for t in tokens if t.type != tokenize.COMMENT]
    comments = [t.string for t in tokens if t.type == tokenize.COMMENT]
    assert "__import__" not in code and "system" not in code
    assert not any("boom" in t for t in code)
    assert sum("__import__" in c for c in comments) == 4  # header, 2 args, 1 result
    x, w = ints(16, 32), ints(32, 8, seed=1)
    (y,) = load_source(source, EVIL).build(mesh)(x, w)
    assert_close(np.asarray(y), x @ w)


# --------------------------------------------------------------------------
# (e) Unsupported ops and types fail by name


@pytest.mark.parametrize(
    ("op", "name"),
    [
        (
            "%yl = stablehlo.custom_call @my_kernel(%xl) : (tensor<4x32xf32>) -> tensor<4x32xf32>",
            "stablehlo.custom_call",
        ),
        (
            '%yl = "stablehlo.cholesky"(%xl) {lower = true} : (tensor<4x32xf32>) -> tensor<4x32xf32>',
            "stablehlo.cholesky",  # parsed as an unregistered op
        ),
        (
            "%c = stablehlo.compare LT, %xl, %xl, TOTALORDER : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xi1>\n"
            "  %yl = stablehlo.select %c, %xl, %xl : tensor<4x32xi1>, tensor<4x32xf32>",
            "stablehlo.compare",
        ),
    ],
)
def test_unsupported_op_is_named(op: str, name: str) -> None:
    dist = '!spmd.dtensor<16x32xf32, [{"batch"}, {}]>'
    text = f"""
{MESH_DECL}
func.func @main(%x: {dist}) -> {dist} {{
  %xl = spmd.to_local %x : {dist} -> tensor<4x32xf32>
  {op}
  %y = spmd.from_local %yl : tensor<4x32xf32> -> {dist}
  func.return %y : {dist}
}}
"""
    module = PartirParser(make_context(allow_unregistered=True), text).parse_module()
    with pytest.raises(UnsupportedOpError, match=rf"{name} \(op #1 of @main\)"):
        emit_jax(module)


def test_partial_arguments_are_rejected() -> None:
    text = MATMUL.replace(
        '%x: !spmd.dtensor<16x32xf32, [{"batch"}, {}]>',
        '%x: !spmd.dtensor<16x32xf32, [{"batch"}, {}], partial {"model"}>',
    ).replace(
        '%xl = spmd.to_local %x : !spmd.dtensor<16x32xf32, [{"batch"}, {}]>',
        '%xl = spmd.to_local %x : !spmd.dtensor<16x32xf32, [{"batch"}, {}], partial {"model"}>',
    )
    with pytest.raises(UnsupportedOpError, match=r"argument 0 of @main.*partial"):
        emit_jax(parse(text))


# --------------------------------------------------------------------------
# (f) The generated code's own checks, and tracebacks into it


def generated_frames(error: BaseException) -> list[traceback.FrameSummary]:
    frames = []
    while error is not None:
        tb = traceback.extract_tb(error.__traceback__)
        frames += [f for f in tb if f.filename.startswith("<partir-generated-")]
        error = error.__cause__ or error.__context__
    return frames


def test_traceback_shows_the_generated_line(mesh: jax.sharding.Mesh) -> None:
    program = load(parse(MATMUL), name="matmul")
    fn = program.build(mesh)
    with pytest.raises(TypeError, match=r"input 0: expected float32\[16, 32\]") as caught:
        fn(ints(16, 48), ints(32, 8))  # divisible, so shard_map alone would accept it
    lines = [f.line for f in generated_frames(caught.value)]
    assert "_check_inputs(a0, a1)" in lines and "raise TypeError(" in lines, lines


def test_tracing_leaves_older_objects_out_of_garbage_collections(
    mesh: jax.sharding.Mesh,
) -> None:
    """The body is traced, and the trace lowered, with the objects made before
    frozen (a full collection would walk them all); the collector is left as
    it was, and objects the caller froze stay frozen."""
    program = load(parse(MATMUL))
    body, frozen_while_tracing = program._body, []

    def watched_body(*args: Any) -> Any:
        frozen_while_tracing.append(gc.get_freeze_count())
        return body(*args)

    program._body = watched_body
    x, w = ints(16, 32), ints(32, 8, seed=1)
    fn = program.build(mesh)
    (y,) = fn(x, w)
    assert frozen_while_tracing[0] > 0 and gc.get_freeze_count() == 0
    fn(x, w)
    assert len(frozen_while_tracing) == 1, "later calls do not trace"
    assert_close(np.asarray(y), x @ w, what="x @ w")
    traced = program.build(mesh).trace(x, w)
    jax_traced, frozen_while_lowering = traced._traced, []

    def watched_lower() -> Any:
        frozen_while_lowering.append(gc.get_freeze_count())
        return jax_traced.lower()

    traced._traced = types.SimpleNamespace(lower=watched_lower)
    lowered = traced.lower()
    assert frozen_while_lowering[0] > 0 and gc.get_freeze_count() == 0
    assert "stablehlo.dot_general" in lowered.as_text()
    gc.freeze()
    try:
        program.build(mesh).trace(x, w).lower()
        assert gc.get_freeze_count() > 0, "the caller's frozen objects were unfrozen"
    finally:
        gc.unfreeze()


def test_build_checks_the_mesh(mesh: jax.sharding.Mesh) -> None:
    program = load(parse(MATMUL))
    devices = np.array(jax.devices()[:8]).reshape(2, 4)
    wrong_shape = jax.sharding.Mesh(devices, ("batch", "model"))
    with pytest.raises(ValueError, match=r"expected mesh shape \(4, 2\)") as caught:
        program.build(wrong_shape)
    assert any("raise ValueError" in f.line for f in generated_frames(caught.value))
    with pytest.raises(ValueError, match="expected mesh axes"):
        program.build(jax.sharding.Mesh(devices.reshape(4, 2), ("data", "model")))
    with pytest.raises(ValueError, match="needs 8 devices, but only 3"):
        program.make_mesh(jax.devices()[:3])


def test_loader_registers_source_but_not_the_module() -> None:
    source = emit_jax(parse(MATMUL))
    first, second = load_source(source, "twice"), load_source(source, "twice")
    assert first.__file__ != second.__file__
    assert first.__file__.startswith("<partir-generated-") and first.__file__.endswith(":twice>")
    assert linecache.getline(first.__file__, 1).startswith("# Generated by partir")
    assert not any(m is first or m is second for m in sys.modules.values())
