"""The interpreter's op semantics, op by op, against XLA.

Each case lowers a small JAX function with `partir.import_jax`, checks that the
op under test is in the module, interprets it and compares with `jax.jit` of
the same function. Ops JAX never emits (or emits only with inputs XLA cannot
run) are written as StableHLO text and checked against NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import scipy.special
from jax import lax
from xdsl.dialects.builtin import IndexType, ModuleOp, UnregisteredOp
from xdsl.utils.exceptions import InterpretationError

import partir
from dialects.chlo import BINARY_CLASSES, UNARY_CLASSES
from dialects.context import make_context
from dialects.dtypes import numpy_dtype
from dialects.interpreter import run_function
from dialects.interpreter.chlo import ChloFunctions
from dialects.interpreter.device_collectives import DeviceCollectiveFunctions
from dialects.interpreter.stablehlo import StableHLOFunctions
from dialects.parser import PartirParser
from dialects.stablehlo_collectives import COLLECTIVE_OPS
from dialects.stablehlo_ext import StableHLO
from tests.numerics import assert_close

RNG = np.random.default_rng(0)
F32 = RNG.standard_normal((3, 4)).astype(np.float32)
POSITIVE = np.abs(F32) + 0.25
UNIT = np.tanh(F32)  # in (-1, 1)
SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.5, 0.5, -0.5, 2.5, 1e30, -3e-30], np.float32
)
INTS = np.array([7, -7, 7, -7, 0, -(2**31), 2**31 - 1, 100, 5], np.int32)
DIVISORS = np.array([2, 2, -2, -2, 0, -1, 0, -7, 3], np.int32)
UINTS = np.array([0, 1, 7, 2**32 - 1, 2**31], np.uint32)
SHIFTS = np.array([0, 1, 31, 32, 40], np.int32)
BF16 = F32.astype(ml_dtypes.bfloat16)
F16 = F32.astype(np.float16)
C64 = (F32 + 1j * POSITIVE).astype(np.complex64)
BOOLS = np.array([True, False, True, False])
BOOLS2 = np.array([True, True, False, False])


def op_names(module: ModuleOp) -> set[str]:
    return {
        op.op_name.data if isinstance(op, UnregisteredOp) else op.name for op in module.walk()
    }


def check(fn: Callable[..., Any], *args: Any, op: str, verify: bool = True) -> None:
    """`fn` interpreted equals `fn` run by XLA, and its lowering contains `op`."""
    module = partir.import_jax(fn, *args)
    if verify:
        module.verify()
    assert op in op_names(module), f"{op} not in {sorted(op_names(module))}"
    got = run_function(module, jax.tree_util.tree_leaves(args))
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, np.asarray(w), what=f"{op} result {i}")


LOW_PRECISION_FLOATS = (np.dtype(ml_dtypes.bfloat16),)


def assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """`assert_close`, also for complex numbers (it drops the imaginary part) and bf16."""
    if np.iscomplexobj(want):
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
        assert_close(got.real, want.real, what=f"{what} (real)")
        assert_close(got.imag, want.imag, what=f"{what} (imag)")
    elif want.dtype in LOW_PRECISION_FLOATS:
        # assert_close compares these exactly but not NaN-aware; f32 holds them exactly.
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
        assert_close(got.astype(np.float32), want.astype(np.float32), what=what)
    else:
        assert_close(got, want, what=what)


def parse(text: str) -> ModuleOp:
    module = PartirParser(make_context(), text).parse_module()
    module.verify()
    return module


def case(fn: Callable[..., Any], *args: Any, op: str, id: str, verify: bool = True) -> Any:
    return pytest.param(fn, args, op, verify, id=id)


ROUND_EVEN = lax.RoundingMethod.TO_NEAREST_EVEN

UNARY_CASES = [
    case(lax.abs, F32, op="stablehlo.abs", id="abs-f32"),
    case(lax.abs, INTS, op="stablehlo.abs", id="abs-int-min"),
    case(lax.abs, C64, op="stablehlo.abs", id="abs-complex"),
    case(lax.cbrt, F32, op="stablehlo.cbrt", id="cbrt"),
    case(jnp.ceil, SPECIAL, op="stablehlo.ceil", id="ceil"),
    case(jnp.floor, SPECIAL, op="stablehlo.floor", id="floor"),
    case(lax.cos, F32, op="stablehlo.cosine", id="cosine"),
    case(lax.sin, F32, op="stablehlo.sine", id="sine"),
    case(lax.tan, F32, op="stablehlo.tan", id="tan"),
    case(lax.tanh, SPECIAL, op="stablehlo.tanh", id="tanh"),
    case(lax.exp, F32, op="stablehlo.exponential", id="exponential"),
    case(lax.exp, C64, op="stablehlo.exponential", id="exponential-complex"),
    case(lax.expm1, F32 * 1e-3, op="stablehlo.exponential_minus_one", id="expm1"),
    case(lax.log, POSITIVE, op="stablehlo.log", id="log"),
    case(lax.log1p, POSITIVE * 1e-4, op="stablehlo.log_plus_one", id="log1p"),
    case(lax.sqrt, POSITIVE, op="stablehlo.sqrt", id="sqrt"),
    case(lax.rsqrt, POSITIVE, op="stablehlo.rsqrt", id="rsqrt"),
    case(lax.clz, INTS, op="stablehlo.count_leading_zeros", id="clz-i32"),
    case(lax.clz, UINTS, op="stablehlo.count_leading_zeros", id="clz-u32"),
    case(lax.population_count, INTS, op="stablehlo.popcnt", id="popcnt"),
    case(lax.is_finite, SPECIAL, op="stablehlo.is_finite", id="is_finite"),
    case(lax.neg, INTS, op="stablehlo.negate", id="negate-int"),
    case(lax.neg, SPECIAL, op="stablehlo.negate", id="negate-f32"),
    case(lax.bitwise_not, INTS, op="stablehlo.not", id="not-int"),
    case(jnp.logical_not, BOOLS, op="stablehlo.not", id="not-bool"),
    case(lax.real, C64, op="stablehlo.real", id="real"),
    case(lax.imag, C64, op="stablehlo.imag", id="imag"),
    case(lax.round, SPECIAL, op="stablehlo.round_nearest_afz", id="round_afz"),
    case(lambda x: lax.round(x, ROUND_EVEN), SPECIAL, op="stablehlo.round_nearest_even",
         id="round_even"),
    case(lax.sign, SPECIAL, op="stablehlo.sign", id="sign-f32"),
    case(lax.sign, INTS, op="stablehlo.sign", id="sign-int"),
    case(lax.sign, C64, op="stablehlo.sign", id="sign-complex"),
]

BINARY_CASES = [
    case(lax.add, F32, POSITIVE, op="stablehlo.add", id="add"),
    case(lax.add, INTS, DIVISORS, op="stablehlo.add", id="add-int-wraps"),
    case(lax.add, C64, C64, op="stablehlo.add", id="add-complex"),
    case(lax.sub, F32, POSITIVE, op="stablehlo.subtract", id="subtract"),
    case(lax.mul, INTS, INTS, op="stablehlo.multiply", id="multiply-int-wraps"),
    case(lax.mul, C64, C64, op="stablehlo.multiply", id="multiply-complex"),
    case(lax.div, F32, POSITIVE, op="stablehlo.divide", id="divide"),
    case(lax.div, INTS, DIVISORS, op="stablehlo.divide", id="divide-int-truncates"),
    case(lax.div, UINTS, UINTS[::-1], op="stablehlo.divide", id="divide-uint"),
    case(lax.rem, INTS, DIVISORS, op="stablehlo.remainder", id="remainder-int"),
    case(lax.rem, F32 * 5, POSITIVE, op="stablehlo.remainder", id="remainder-f32"),
    case(lax.max, SPECIAL, SPECIAL[::-1], op="stablehlo.maximum", id="maximum-nan-inf"),
    case(lax.min, SPECIAL, SPECIAL[::-1], op="stablehlo.minimum", id="minimum-nan-inf"),
    case(lax.max, INTS, DIVISORS, op="stablehlo.maximum", id="maximum-int"),
    case(lax.min, UINTS, UINTS[::-1], op="stablehlo.minimum", id="minimum-uint"),
    case(lax.bitwise_and, INTS, DIVISORS, op="stablehlo.and", id="and-int"),
    case(jnp.logical_and, BOOLS, BOOLS2, op="stablehlo.and", id="and-bool"),
    case(lax.bitwise_or, INTS, DIVISORS, op="stablehlo.or", id="or-int"),
    case(jnp.logical_or, BOOLS, BOOLS2, op="stablehlo.or", id="or-bool"),
    case(lax.bitwise_xor, INTS, DIVISORS, op="stablehlo.xor", id="xor-int"),
    case(lax.atan2, F32, F32.T.reshape(3, 4), op="stablehlo.atan2", id="atan2"),
    case(lax.complex, F32, POSITIVE, op="stablehlo.complex", id="complex"),
    case(lax.pow, POSITIVE, F32, op="stablehlo.power", id="power"),
    case(lax.pow, C64, C64 * 0.5, op="stablehlo.power", id="power-complex"),
    case(lax.shift_left, np.full(5, -3, np.int32), SHIFTS, op="stablehlo.shift_left",
         id="shift_left"),
    case(lax.shift_right_logical, np.full(5, -8, np.int32), SHIFTS,
         op="stablehlo.shift_right_logical", id="shift_right_logical"),
    case(lax.shift_right_arithmetic, np.full(5, -8, np.int32), SHIFTS,
         op="stablehlo.shift_right_arithmetic", id="shift_right_arithmetic"),
    case(lax.shift_right_arithmetic, UINTS, SHIFTS.astype(np.uint32),
         op="stablehlo.shift_right_arithmetic", id="shift_right_arithmetic-uint"),
]

LOW_PRECISION_CASES = [
    case(lambda a, b: (a + b, a * b, a - b, a / b), x, x[::-1], op="stablehlo.divide",
         id=f"arith-{x.dtype}")
    for x in (BF16, F16)
] + [
    case(lambda a: (jnp.exp(a), jnp.tanh(a), jnp.sqrt(jnp.abs(a))), x, op="stablehlo.tanh",
         id=f"math-{x.dtype}")
    for x in (BF16, F16)
] + [
    case(lambda a: jnp.max(a, axis=1), x, op="stablehlo.reduce", id=f"max-reduce-{x.dtype}")
    for x in (BF16, F16)
]

CONVERT_CASES = [
    case(lambda x: x.astype(np.int32), SPECIAL, op="stablehlo.convert", id="f32-to-i32"),
    case(lambda x: x.astype(np.uint8), SPECIAL, op="stablehlo.convert", id="f32-to-u8"),
    case(lambda x: x.astype(np.int8), INTS, op="stablehlo.convert", id="i32-to-i8-wraps"),
    case(lambda x: x.astype(np.float32), INTS, op="stablehlo.convert", id="i32-to-f32"),
    case(lambda x: x.astype(np.float32), UINTS, op="stablehlo.convert", id="u32-to-f32"),
    case(lambda x: x.astype(bool), SPECIAL, op="stablehlo.convert", id="f32-to-bool"),
    case(lambda x: x.astype(np.float32), BOOLS, op="stablehlo.convert", id="bool-to-f32"),
    case(lambda x: x.astype(ml_dtypes.bfloat16), SPECIAL, op="stablehlo.convert",
         id="f32-to-bf16"),
    case(lambda x: x.astype(np.float32), BF16, op="stablehlo.convert", id="bf16-to-f32"),
    case(lambda x: x.astype(np.complex64), F32, op="stablehlo.convert", id="f32-to-c64"),
]

COMPARE_CASES = [
    case(lambda a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b), x, y,
         op="stablehlo.compare", id=name)
    for name, x, y in [
        ("f32-nan-inf", SPECIAL, SPECIAL[::-1]),
        ("signed", INTS, DIVISORS),
        ("unsigned", UINTS, UINTS[::-1]),
        ("bool", BOOLS, BOOLS2),
    ]
] + [
    case(lambda a, b: (a == b, a != b), C64, C64 * np.array([1, 2, 1, 2], np.complex64),
         op="stablehlo.compare", id="complex-eq"),
]

OTHER_ELEMENTWISE_CASES = [
    case(lambda c, a, b: jnp.where(c, a, b), BOOLS, SPECIAL[:4], SPECIAL[4:8],
         op="stablehlo.select", id="select"),
    case(lambda x: lax.clamp(np.float32(-0.5), x, np.float32(0.5)), SPECIAL,
         op="stablehlo.clamp", id="clamp-scalar-bounds"),
    case(lax.clamp, F32 - 1, SPECIAL.reshape(3, 4), F32 + 1, op="stablehlo.clamp",
         id="clamp-array-bounds"),
    case(lambda x: lax.bitcast_convert_type(x, np.int32), SPECIAL,
         op="stablehlo.bitcast_convert", id="bitcast-f32-i32"),
    case(lambda x: lax.bitcast_convert_type(x, np.uint8), F32,
         op="stablehlo.bitcast_convert", id="bitcast-f32-to-u8x4"),
    case(lambda x: lax.bitcast_convert_type(x, np.float32), INTS[:8].view(np.uint8).reshape(8, 4),
         op="stablehlo.bitcast_convert", id="bitcast-u8x4-to-f32"),
    case(lambda x: lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10),
         np.concatenate([SPECIAL, F32.ravel() * 1e4, F32.ravel() * 1e-6]),
         op="stablehlo.reduce_precision", id="reduce_precision-to-f16"),
    case(lambda x: lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7),
         np.concatenate([SPECIAL, F32.ravel()]), op="stablehlo.reduce_precision",
         id="reduce_precision-to-bf16"),
    case(lambda x: lax.reduce_precision(x, exponent_bits=3, mantissa_bits=0),
         np.concatenate([SPECIAL[1:], F32.ravel() * 4]), op="stablehlo.reduce_precision",
         id="reduce_precision-no-mantissa"),
]

WINDOW_DNUMS = lax.ScatterDimensionNumbers(
    update_window_dims=(1, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=(0,)
)


def _window_scatter(x: Any, i: Any, v: Any) -> Any:
    """Adds 2-row windows at rows `i`; XLA drops a window that hangs over the end."""
    return lax.scatter_add(x, i, v, WINDOW_DNUMS)


TAKE = np.array([[0, 3, 1, 1], [2, 2, 0, 3], [1, 0, 3, 2]], np.int32)
ROWS = np.array([2, 0, -1, 5], np.int32)  # -1 wraps; 5 is out of bounds
SCATTER_ROWS = np.array([1, 0, 1, 2, 7], np.int32)  # 1 twice; 7 is out of bounds
XS = RNG.standard_normal((3, 5)).astype(np.float32)
UPDATES = RNG.standard_normal((5, 3)).astype(np.float32)
BATCH_IDX = np.array([[1], [4], [0]], np.int32)

DATA_MOVEMENT_CASES = [
    case(lambda x: jnp.broadcast_to(x[:, None, :], (3, 2, 4)), F32,
         op="stablehlo.broadcast_in_dim", id="broadcast_in_dim"),
    case(lambda x, y: jnp.concatenate([x, y, x], axis=1), F32, POSITIVE,
         op="stablehlo.concatenate", id="concatenate"),
    case(lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3)), F32, np.int32(1), np.int32(-4),
         op="stablehlo.dynamic_slice", id="dynamic_slice-clamped"),
    case(lambda x, i: jnp.take_along_axis(x, i, axis=1), F32, TAKE, op="stablehlo.gather",
         id="gather-take_along_axis"),
    case(lambda x, i: x[i], F32.T, ROWS, op="stablehlo.gather", id="gather-rows-clamped"),
    case(lambda x, i: jnp.take(x, i, axis=0, mode="fill", fill_value=-1.0), F32.T, ROWS,
         op="stablehlo.gather", id="gather-fill"),
    case(lambda x, i: x[i, 1:3], F32.T, ROWS[:2], op="stablehlo.gather", id="gather-window"),
    case(jax.vmap(lambda x, i: x[i]), XS, BATCH_IDX, op="stablehlo.gather",
         id="gather-batching-dims"),
    case(lambda x: lax.pad(x, np.float32(-1), ((1, -1, 1), (-2, 3, 2))), F32,
         op="stablehlo.pad", id="pad-negative-interior"),
    case(lambda x: lax.pad(x, np.int32(9), ((0, 0, 0), (2, 1, 0))), TAKE, op="stablehlo.pad",
         id="pad-int"),
    case(lambda x: x.reshape(2, 6), F32, op="stablehlo.reshape", id="reshape"),
    case(lambda x: x[1:3, ::2], F32, op="stablehlo.slice", id="slice-strided"),
    case(lambda x: jnp.transpose(x.reshape(3, 2, 2), (2, 0, 1)), F32,
         op="stablehlo.transpose", id="transpose"),
    case(lambda x: x[::-1], F32, op="stablehlo.reverse", id="reverse"),
    case(lambda x: jnp.flip(x.reshape(3, 2, 2), (0, 2)), F32, op="stablehlo.reverse",
         id="reverse-two-dims"),
    case(lambda x: jnp.flip(x), INTS, op="stablehlo.reverse", id="reverse-int"),
    case(lambda x, i, v: x.at[i].add(v), XS.T, SCATTER_ROWS, UPDATES,
         op="stablehlo.scatter", id="scatter-add-duplicates-oob"),
    case(lambda x, i, v: x.at[i].set(v), XS.T, SCATTER_ROWS[1:], UPDATES[1:],
         op="stablehlo.scatter", id="scatter-set"),
    case(lambda x, i, v: x.at[i].max(v), XS.T, SCATTER_ROWS, UPDATES,
         op="stablehlo.scatter", id="scatter-max-region"),
    case(lambda x, i, v: x.at[i].multiply(v), INTS, ROWS, np.array([2, 3, 4, 5], np.int32),
         op="stablehlo.scatter", id="scatter-multiply-int"),
    case(jax.vmap(lambda x, i, v: x.at[i].add(v)), XS, BATCH_IDX, np.ones((3, 1), np.float32),
         op="stablehlo.scatter", id="scatter-batching-dims"),
    case(_window_scatter, XS, np.array([[0], [2], [1]], np.int32),
         np.ones((3, 2, 5), np.float32), op="stablehlo.scatter",
         id="scatter-window-partly-out-of-bounds"),
]


def _first_max(xs: Any) -> Any:
    return jnp.argmax(xs, axis=1), jnp.argmin(xs, axis=0)


def _sum_of_abs(x: Any) -> Any:
    return lax.reduce(x, np.float32(0), lambda a, b: jnp.abs(a) + jnp.abs(b), (1,))


def _max_and_count(x: Any, y: Any) -> Any:
    def body(a: Any, b: Any) -> Any:
        return jnp.maximum(a[0], b[0]), a[1] + b[1]

    return lax.reduce((x, y), (np.float32(-np.inf), np.int32(0)), body, (0,))


REDUCE_CASES = [
    case(lambda x: jnp.sum(x, axis=1), F32, op="stablehlo.reduce", id="sum"),
    case(lambda x: jnp.sum(x, axis=(0, 2)), F32.reshape(3, 2, 2), op="stablehlo.reduce",
         id="sum-two-dims"),
    case(lambda x: jnp.max(x, axis=0), SPECIAL.reshape(4, 3), op="stablehlo.reduce",
         id="max-neg-inf-init-nan"),
    case(lambda x: jnp.min(x), F32, op="stablehlo.reduce", id="min-all"),
    case(lambda x: jnp.prod(x, axis=0), F32, op="stablehlo.reduce", id="prod"),
    case(lambda x: jnp.sum(x), INTS, op="stablehlo.reduce", id="sum-int-wraps"),
    case(lambda x: (jnp.all(x), jnp.any(x)), BOOLS, op="stablehlo.reduce", id="all-any"),
    case(_first_max, np.array([[1, 5, 5, 2], [np.nan, 1, 2, 3], [0, 0, 0, 0]], np.float32),
         op="stablehlo.reduce", id="argmax-argmin-two-inputs"),
    case(_sum_of_abs, np.round(F32 * 8), op="stablehlo.reduce", id="custom-body"),
    case(_max_and_count, F32, TAKE, op="stablehlo.reduce", id="custom-two-inputs"),
    case(lambda x: jnp.sum(x, axis=1), np.zeros((3, 0), np.float32), op="stablehlo.reduce",
         id="empty"),
]

DOT_CASES = [
    case(jnp.matmul, F32, POSITIVE.T, op="stablehlo.dot_general", id="matmul"),
    case(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), F32.reshape(2, 3, 2),
         POSITIVE.reshape(2, 2, 3), op="stablehlo.dot_general", id="batch"),
    case(lambda a, b: jnp.einsum("ijk,jkb,bl->bil", a, b, np.ones((3, 2), np.float32)),
         F32.reshape(3, 2, 2), POSITIVE.reshape(2, 2, 3), op="stablehlo.dot_general",
         id="two-contracting"),
    case(lambda a, b: lax.dot_general(a, b, (((2,), (0,)), ((1,), (2,)))),
         F32.reshape(3, 2, 2), POSITIVE.reshape(2, 3, 2), op="stablehlo.dot_general",
         id="batch-dim-not-first"),
    case(lambda a, b: jnp.matmul(a, b, preferred_element_type=np.int32),
         INTS[:8].astype(np.int8).reshape(2, 4), TAKE.astype(np.int8).T,
         op="stablehlo.dot_general", id="int8-to-int32"),
    case(lambda a, b: jnp.matmul(a, b, preferred_element_type=np.float32), BF16, BF16.T,
         op="stablehlo.dot_general", id="bf16-to-f32"),
]


def _cond(p: Any, x: Any) -> Any:
    return lax.cond(p > 0, lambda v: jnp.sin(v), lambda v: v * 2, x)


def _switch(i: Any, x: Any) -> Any:
    return lax.switch(i, [lambda v: v + 1, lambda v: v * 3, jnp.cos], x)


def _fori(n: Any, x: Any) -> Any:
    return lax.fori_loop(0, n, lambda i, v: v * 0.5 + i, x)


def _while(x: Any) -> Any:
    return lax.while_loop(lambda c: c[0] < 100, lambda c: (c[0] * 2 + 1, c[1] + 1), (x, 0))


CONTROL_CASES = [
    # JAX lowers lax.cond to stablehlo.case; stablehlo.if is tested on text below.
    case(_cond, np.float32(1), F32, op="stablehlo.case", id="cond-true"),
    case(_cond, np.float32(-1), F32, op="stablehlo.case", id="cond-false"),
    case(_switch, np.int32(1), F32, op="stablehlo.case", id="case"),
    case(_switch, np.int32(7), F32, op="stablehlo.case", id="case-index-clamped"),
    case(_fori, np.int32(5), F32, op="stablehlo.while", id="fori_loop"),
    case(_while, np.int32(3), op="stablehlo.while", id="while_loop"),
    case(lambda x: lax.optimization_barrier((x, x * 2)), F32,
         op="stablehlo.optimization_barrier", id="optimization_barrier"),
]

CONSTANT_CASES = [
    case(lambda x: x + np.array([np.nan, np.inf, -np.inf, -0.0], np.float32), F32[0],
         op="stablehlo.constant", id="nan-inf"),
    case(lambda x: x * np.arange(12, dtype=np.float32).reshape(3, 4), F32,
         op="stablehlo.constant", id="non-splat"),
    case(lambda x: (x + np.int8(-3), x | np.int8(64)), INTS.astype(np.int8),
         op="stablehlo.constant", id="int8"),
    case(lambda x: x & np.array([True, False, True, True]), BOOLS, op="stablehlo.constant",
         id="bool"),
    case(lambda x: x * np.array([1.5, -np.inf, 3.0, 0.1], ml_dtypes.bfloat16),
         BF16[0], op="stablehlo.constant", id="bf16"),
    case(lambda x: x + lax.iota(np.int32, 12).reshape(3, 4), TAKE, op="stablehlo.iota",
         id="iota"),
    case(lambda x: x * lax.broadcasted_iota(np.float32, (3, 4), 0), F32, op="stablehlo.iota",
         id="broadcasted_iota"),
]

_SP = jax.scipy.special
CHLO_CASES = [
    case(_SP.erf, F32, op="chlo.erf", id="erf"),
    case(_SP.erfc, F32, op="chlo.erfc", id="erfc"),
    case(lax.erf_inv, np.append(UNIT.ravel(), [1, -1, 0]).astype(np.float32),
         op="chlo.erf_inv", id="erf_inv"),
    case(lax.lgamma, np.append(F32.ravel() * 3, [0, -1, 2]).astype(np.float32),
         op="chlo.lgamma", id="lgamma"),
    case(lax.digamma, np.append(F32.ravel() * 3, [0, -2, 1]).astype(np.float32),
         op="chlo.digamma", id="digamma-poles"),
    case(lax.bessel_i1e, F32 * 4, op="chlo.bessel_i1e", id="bessel_i1e"),
    case(lax.nextafter, SPECIAL[3:], SPECIAL[2:-1], op="chlo.next_after", id="next_after"),
    case(lambda n, x: _SP.polygamma(n, x), TAKE, POSITIVE * 3, op="chlo.polygamma",
         id="polygamma"),
    case(_SP.zeta, POSITIVE + 1, POSITIVE * 2, op="chlo.zeta", id="zeta"),
    case(jnp.square, F32, op="chlo.square", id="square"),
    case(lax.cosh, F32, op="chlo.cosh", id="cosh"),
    case(lax.sinh, F32, op="chlo.sinh", id="sinh"),
    case(lax.acos, UNIT, op="chlo.acos", id="acos"),
    case(lax.asin, UNIT, op="chlo.asin", id="asin"),
    case(lax.atan, F32, op="chlo.atan", id="atan"),
    case(lax.acosh, POSITIVE + 1, op="chlo.acosh", id="acosh"),
    case(lax.asinh, F32, op="chlo.asinh", id="asinh"),
    case(lax.atanh, UNIT, op="chlo.atanh", id="atanh"),
]

ALL_CASES = (
    UNARY_CASES + BINARY_CASES + LOW_PRECISION_CASES + CONVERT_CASES + COMPARE_CASES
    + OTHER_ELEMENTWISE_CASES + DATA_MOVEMENT_CASES + REDUCE_CASES + DOT_CASES + CONTROL_CASES
    + CONSTANT_CASES + CHLO_CASES
)


@pytest.mark.parametrize(("fn", "args", "op", "verify"), ALL_CASES)
def test_op_matches_xla(fn: Callable[..., Any], args: tuple, op: str, verify: bool):
    check(fn, *args, op=op, verify=verify)


# --------------------------------------------------------------------------
# Ops JAX does not emit, written by hand and checked against NumPy.


def run_text(text: str, *args: np.ndarray) -> list[np.ndarray]:
    return run_function(parse(text), list(args))


def test_logistic():
    (got,) = run_text(
        """
        func.func @main(%x: tensor<12xf32>) -> tensor<12xf32> {
          %0 = stablehlo.logistic %x : tensor<12xf32>
          func.return %0 : tensor<12xf32>
        }""",
        SPECIAL,
    )
    assert_close(got, scipy.special.expit(SPECIAL.astype(np.float64)).astype(np.float32))


def test_integer_power_negative_exponents():
    base = np.array([2, -1, -1, 1, 3, 0, -2, 5], np.int32)
    exponent = np.array([-1, -3, -2, -5, 3, 0, 31, 20], np.int32)
    (got,) = run_text(
        """
        func.func @main(%a: tensor<8xi32>, %b: tensor<8xi32>) -> tensor<8xi32> {
          %0 = stablehlo.power %a, %b : tensor<8xi32>
          func.return %0 : tensor<8xi32>
        }""",
        base,
        exponent,
    )
    want = [0, -1, 1, 1, 27, 1, np.int32(-(2**31)), np.int64(5**20).astype(np.int32)]
    assert_close(got, np.array(want, np.int32))


MAP = """
func.func @main(%x: tensor<2x3xf32>, %y: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = "stablehlo.map"(%x, %y) <{dimensions = array<i64: 0, 1>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %c = BODY
    stablehlo.return %c : tensor<f32>
  }) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  func.return %0 : tensor<2x3xf32>
}
"""


@pytest.mark.parametrize(
    "body",
    [
        "stablehlo.atan2 %a, %b : tensor<f32>",
        # Not elementwise, so the body runs once per element.
        "stablehlo.reshape %a : (tensor<f32>) -> tensor<f32>",
    ],
    ids=["batched", "per-element"],
)
def test_map(body: str):
    x, y = F32[:2, :3], POSITIVE[:2, :3]
    (got,) = run_text(MAP.replace("BODY", body), x, y)
    assert_close(got, np.arctan2(x, y) if "atan2" in body else x)


def test_reduce_with_a_body_that_is_not_elementwise():
    (got,) = run_text(
        """
        func.func @main(%x: tensor<3x4xf32>) -> tensor<3xf32> {
          %zero = stablehlo.constant dense<0.0> : tensor<f32>
          %0 = stablehlo.reduce(%x init: %zero) across dimensions = [1]
              : (tensor<3x4xf32>, tensor<f32>) -> tensor<3xf32>
          reducer(%a: tensor<f32>, %b: tensor<f32>) {
            %r = stablehlo.reshape %b : (tensor<f32>) -> tensor<f32>
            %s = stablehlo.add %a, %r : tensor<f32>
            stablehlo.return %s : tensor<f32>
          }
          func.return %0 : tensor<3xf32>
        }""",
        F32,
    )
    assert_close(got, F32.sum(axis=1))


TOTAL_ORDER = """
func.func @main(%x: tensor<6xf32>, %y: tensor<6xf32>) -> (tensor<6xi1>, tensor<6xi1>) {
  %0 = stablehlo.compare EQ, %x, %y, TOTALORDER : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xi1>
  %1 = stablehlo.compare LT, %x, %y, TOTALORDER : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xi1>
  func.return %0, %1 : tensor<6xi1>, tensor<6xi1>
}
"""


def test_compare_total_order():
    """-NaN < -inf < -0 < +0 < +NaN, and a NaN equals itself."""
    x = np.array([np.nan, -np.nan, 0.0, -0.0, -np.inf, 1.0], np.float32)
    y = np.array([np.nan, 1.0, -0.0, 0.0, -np.nan, 1.0], np.float32)
    got = run_text(TOTAL_ORDER, x, y)
    assert_close(got[0], np.array([True, False, False, False, False, True]))
    assert_close(got[1], np.array([False, True, False, True, False, False]))


def test_broadcast_in_dim_with_permuted_dims():
    (got,) = run_text(
        """
        func.func @main(%x: tensor<3x4xf32>) -> tensor<4x2x3xf32> {
          %0 = stablehlo.broadcast_in_dim %x, dims = [2, 0] : (tensor<3x4xf32>) -> tensor<4x2x3xf32>
          func.return %0 : tensor<4x2x3xf32>
        }""",
        F32,
    )
    assert_close(got, np.broadcast_to(F32.T[:, None, :], (4, 2, 3)))


def test_dynamic_broadcast_in_dim():
    (got,) = run_text(
        """
        func.func @main(%x: tensor<4xf32>, %shape: tensor<2xi64>) -> tensor<3x4xf32> {
          %0 = stablehlo.dynamic_broadcast_in_dim %x, %shape, dims = [1]
              : (tensor<4xf32>, tensor<2xi64>) -> tensor<3x4xf32>
          func.return %0 : tensor<3x4xf32>
        }""",
        F32[0],
        np.array([3, 4], np.int64),
    )
    assert_close(got, np.broadcast_to(F32[0], (3, 4)))


def test_tokens_pass_through_after_all_and_optimization_barrier():
    (got,) = run_text(
        """
        func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
          %t = "stablehlo.after_all"() : () -> !stablehlo.token
          %y, %u = "stablehlo.optimization_barrier"(%x, %t)
              : (tensor<4xf32>, !stablehlo.token) -> (tensor<4xf32>, !stablehlo.token)
          func.return %y : tensor<4xf32>
        }""",
        F32[0],
    )
    assert_close(got, F32[0])


MLIR_TYPES = {"float32": "f32", "int32": "i32", "bool": "i1", "complex64": "complex<f32>"}


def tensor_type(x: np.ndarray) -> str:
    return f"tensor<{'x'.join(map(str, x.shape))}x{MLIR_TYPES[x.dtype.name]}>"


def run_chlo_unary(name: str, x: np.ndarray, result: np.ndarray) -> np.ndarray:
    (got,) = run_text(
        f"""
        func.func @main(%x: {tensor_type(x)}) -> {tensor_type(result)} {{
          %0 = chlo.{name} %x : {tensor_type(x)} -> {tensor_type(result)}
          func.return %0 : {tensor_type(result)}
        }}""",
        x,
    )
    return got


def _c128(fn: Callable[..., Any], x: np.ndarray) -> np.ndarray:
    return fn(x.astype(np.complex128)).astype(np.complex64)


with np.errstate(over="ignore"):
    SQUARED_INTS = INTS * INTS  # wraps


@pytest.mark.parametrize(
    ("name", "x", "want"),
    [
        pytest.param("is_inf", SPECIAL, np.isinf(SPECIAL), id="is_inf"),
        pytest.param("is_neg_inf", SPECIAL, np.isneginf(SPECIAL), id="is_neg_inf"),
        pytest.param("is_pos_inf", SPECIAL, np.isposinf(SPECIAL), id="is_pos_inf"),
        pytest.param("conj", C64[0], np.conj(C64[0]), id="conj"),
        pytest.param("tan", C64[0], _c128(np.tan, C64[0]), id="tan-complex"),
        pytest.param("square", INTS, SQUARED_INTS, id="square-int-wraps"),
        pytest.param("square", C64[0], _c128(np.square, C64[0]), id="square-complex"),
    ],
)
def test_chlo_ops_jax_does_not_emit(name: str, x: np.ndarray, want: np.ndarray):
    assert_same(run_chlo_unary(name, x, want), want)


IF = """
func.func @main(%p: tensor<i1>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.if"(%p) ({
    %1 = stablehlo.sine %x : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }, {
    %2 = stablehlo.negate %x : tensor<4xf32>
    stablehlo.return %2 : tensor<4xf32>
  }) : (tensor<i1>) -> tensor<4xf32>
  func.return %0 : tensor<4xf32>
}
"""


@pytest.mark.parametrize("pred", [True, False])
def test_if(pred: bool):
    x = F32[0]
    (got,) = run_text(IF, np.array(pred), x)
    assert_close(got, np.sin(x.astype(np.float64)).astype(np.float32) if pred else -x)


CASE = """
func.func @main(%i: tensor<i32>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.case"(%i) ({
    stablehlo.return %x : tensor<4xf32>
  }, {
    %1 = stablehlo.negate %x : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  func.return %0 : tensor<4xf32>
}
"""


@pytest.mark.parametrize(("index", "branch"), [(0, 0), (1, 1), (-1, 1), (5, 1)])
def test_case_out_of_range_index_runs_the_last_branch(index: int, branch: int):
    x = F32[0]
    (got,) = run_text(CASE, np.array(index, np.int32), x)
    assert_close(got, -x if branch else x)


def test_complex_constant():
    """JAX's complex constants do not import yet, so this one is written by hand."""
    (got,) = run_text(
        """
        func.func @main(%x: tensor<2xcomplex<f32>>) -> tensor<2xcomplex<f32>> {
          %c = stablehlo.constant dense<[(1.5, -2.0), (0.0, 3.25)]> : tensor<2xcomplex<f32>>
          %0 = stablehlo.add %x, %c : tensor<2xcomplex<f32>>
          func.return %0 : tensor<2xcomplex<f32>>
        }""",
        np.zeros(2, np.complex64),
    )
    want = np.zeros(2, np.complex64)
    want.real, want.imag = [1.5, 0.0], [-2.0, 3.25]
    assert_same(got, want)


def test_reduce_precision_without_mantissa_turns_nan_into_inf():
    """As the spec's reference interpreter does (XLA keeps the NaN)."""
    (got,) = run_text(
        """
        func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
          %0 = stablehlo.reduce_precision %x, format = e5m0 : tensor<3xf32>
          func.return %0 : tensor<3xf32>
        }""",
        np.array([np.nan, 3.0, 6.0], np.float32),
    )
    # With no mantissa bits, ties go to the even exponent: 3 -> 2, 6 -> 8.
    assert_close(got, np.array([np.inf, 2.0, 8.0], np.float32))


# --------------------------------------------------------------------------
# Coverage and failures


def _implemented(functions: type) -> set[type]:
    return {op_type for op_type, _ in functions._impls()}


def test_every_dialect_op_has_an_implementation():
    """Each on one device, but StableHLO's collectives, which run on every
    device at once (`dialects.interpreter.device_collectives`)."""
    across = set(COLLECTIVE_OPS)
    assert set(StableHLO.operations) - across <= _implemented(StableHLOFunctions)
    assert across <= _implemented(DeviceCollectiveFunctions)
    chlo = {*UNARY_CLASSES.values(), *BINARY_CLASSES.values()}
    assert chlo <= _implemented(ChloFunctions)


def test_custom_call_raises_naming_the_target():
    module = parse(
        """
        func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
          %0 = stablehlo.custom_call @lapack_spotrf_ffi(%x) : (tensor<3xf32>) -> tensor<3xf32>
          func.return %0 : tensor<3xf32>
        }"""
    )
    with pytest.raises(InterpretationError, match=r"stablehlo\.custom_call @lapack_spotrf_ffi"):
        run_function(module, [F32[0, :3]])


def test_unregistered_op_raises_naming_it():
    def spectrum(x):
        return jnp.fft.fft(x).real

    module = partir.import_jax(spectrum, F32[0])
    assert "stablehlo.fft" in op_names(module)
    with pytest.raises(InterpretationError, match=r"stablehlo\.fft"):
        run_function(module, [F32[0]])


# --------------------------------------------------------------------------
# dtypes and constants

CONSTANTS = """
func.func @main() -> (tensor<3xf32>, tensor<2x2xi1>, tensor<2x3xbf16>, tensor<2xui8>) {
  %0 = stablehlo.constant dense<[0x7FC00001, 0xFF800000, -0.0]> : tensor<3xf32>
  %1 = stablehlo.constant dense<[[true, false], [false, true]]> : tensor<2x2xi1>
  %2 = stablehlo.constant dense<0xFF80> : tensor<2x3xbf16>
  %3 = stablehlo.constant dense<[255, 1]> : tensor<2xui8>
  func.return %0, %1, %2, %3 : tensor<3xf32>, tensor<2x2xi1>, tensor<2x3xbf16>, tensor<2xui8>
}
"""


def test_constants_keep_their_bits_dtype_and_shape():
    floats, bools, splat, unsigned = run_text(CONSTANTS)
    assert floats.dtype == np.float32
    np.testing.assert_array_equal(floats.view(np.uint32), [0x7FC00001, 0xFF800000, 0x80000000])
    np.testing.assert_array_equal(bools, np.eye(2, dtype=bool))
    assert splat.dtype == ml_dtypes.bfloat16 and splat.shape == (2, 3)
    assert np.isneginf(splat.astype(np.float32)).all()
    assert unsigned.dtype == np.uint8
    np.testing.assert_array_equal(unsigned, [255, 1])


def test_unknown_element_type_is_named():
    with pytest.raises(InterpretationError, match="index"):
        numpy_dtype(IndexType())
