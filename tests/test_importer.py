"""Importing JAX programs: names, inlining, round trips, and unsupported ops."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.dialects import func
from xdsl.dialects.builtin import UnregisteredOp
from xdsl.utils.exceptions import VerifyException

import examples
import partir
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.parser import PartirParser
from dialects.stablehlo_ext import ReverseOp
from partir.importer import NAME_ATTR, entry_function, ssa_name


def _names(attrs) -> list[str]:
    return [d.data[NAME_ATTR].data for d in attrs.data]


@pytest.fixture(scope="module", params=examples.ALL)
def imported(request):
    mod = importlib.import_module(f"examples.{request.param}")
    args = mod.make_args()
    return mod, args, partir.import_jax(mod.program, *args)


def test_examples_import_and_verify(imported):
    _, _, module = imported
    module.verify()
    assert not any(isinstance(op, func.CallOp) for op in module.walk())
    assert [op.sym_name.data for op in module.body.block.ops if isinstance(op, func.FuncOp)] == [
        "main"
    ]


def test_print_parse_print_is_a_fixed_point(imported):
    _, _, module = imported
    text = str(module)
    again = PartirParser(make_context(), text).parse_module()
    again.verify()
    assert str(again) == text


def test_arguments_and_results_are_named_by_pytree_path():
    from examples import mlp_train_step

    args = mlp_train_step.make_args()
    entry = entry_function(partir.import_jax(mlp_train_step.program, *args))
    assert _names(entry.arg_attrs) == [
        "params['b1']", "params['b2']", "params['w1']", "params['w2']", "x", "y",
    ]
    assert _names(entry.res_attrs) == [
        "result[0]", "result[1]['b1']", "result[1]['b2']", "result[1]['w1']", "result[1]['w2']",
    ]
    assert [a.name_hint for a in entry.body.block.args] == [
        "params_b1", "params_b2", "params_w1", "params_w2", "x", "y",
    ]


def test_names_follow_any_pytree_layout():
    """Lists, tuples, nested dicts and positional-only lambdas all get paths."""

    def fn(layers, pair, /, scale):
        out = scale
        for layer in layers:
            out = out * layer["w"].sum()
        return {"out": out, "both": (pair[0] + 1, pair[1])}

    layers = [{"w": np.ones((2, 3), np.float32)} for _ in range(2)]
    pair = (np.zeros(4, np.float32), np.ones((), np.int32))
    entry = entry_function(partir.import_jax(fn, layers, pair, np.float32(2)))
    assert _names(entry.arg_attrs) == [
        "layers[0]['w']", "layers[1]['w']", "pair[0]", "pair[1]", "scale",
    ]
    assert _names(entry.res_attrs) == ["result['both'][0]", "result['both'][1]", "result['out']"]


def test_unnamed_parameters_fall_back_to_positions():
    entry = entry_function(partir.import_jax(lambda *xs: xs[0] + xs[1], np.ones(2), np.ones(2)))
    assert _names(entry.arg_attrs) == ["args[0]", "args[1]"]


def test_ssa_names_are_valid_identifiers():
    assert ssa_name("params['blocks'][3]['attn']['wq']") == "params_blocks_3_attn_wq"
    assert ssa_name("[0]") == "v_0"


def test_private_functions_are_inlined():
    def fn(x):
        return jax.nn.relu(x) + jnp.where(x > 0, x, 0.0)  # both lower to func.call

    lowered_text = jax.jit(fn).lower(np.ones(4, np.float32)).as_text()
    assert "call @" in lowered_text
    module = partir.import_jax(fn, np.ones(4, np.float32))
    assert not any(isinstance(op, func.CallOp) for op in module.walk())


def test_an_op_partir_does_not_know_still_imports_by_name():
    def fn(x):
        return jnp.fft.fft(x).real

    module = partir.import_jax(fn, np.arange(8, dtype=np.float32))
    unknown = [op for op in module.walk() if isinstance(op, UnregisteredOp)]
    assert [op.op_name.data for op in unknown] == ["stablehlo.fft"]


def test_chlo_ops_import_as_chlo():
    module = partir.import_jax(lambda x: jnp.square(x) + jax.scipy.special.erf(x), np.ones(3))
    names = {op.name for op in module.walk()}
    assert {"chlo.square", "chlo.erf"} <= names


def test_special_float_constants_survive_import():
    """-inf (max-reduction init) and NaN constants must not become integers."""
    from dialects.dtypes import dense_to_numpy

    module = partir.import_jax(lambda x: (jnp.max(x), jnp.full(2, jnp.nan)), np.ones(3, np.float32))
    values = [dense_to_numpy(op.value) for op in module.walk() if op.name == "stablehlo.constant"]
    flat = np.concatenate([v.ravel() for v in values])
    assert np.isneginf(flat).any() and np.isnan(flat).any()
    assert not (np.abs(flat[np.isfinite(flat)]) > 1e9).any()


def test_jax_errors_propagate_unchanged():
    def bad(x, w):
        return x @ w

    with pytest.raises(TypeError, match="dot_general requires contracting dimensions"):
        partir.import_jax(bad, np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))


def test_round_trip_keeps_a_two_input_reduce_and_attributes_correct():
    """argmax is a two-input reduce: after print -> parse it must compute the same."""
    from dialects.interpreter import run_function

    x = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]], np.float32)
    module = partir.import_jax(lambda x: jnp.argmax(x, axis=1), x)
    reduce_op = next(op for op in module.walk() if op.name == "stablehlo.reduce")
    reduce_op.attributes["note"] = __import__("xdsl").dialects.builtin.StringAttr("kept")
    text = str(module)
    again = PartirParser(make_context(), text).parse_module()
    again.verify()
    assert str(again) == text
    (got,) = run_function(again, [x])
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))


def test_float_pad_verifies():
    module = partir.import_jax(lambda x: jnp.pad(x, ((1, 2), (0, 1))), np.ones((2, 3), np.float32))
    module.verify()
    assert any(op.name == "stablehlo.pad" for op in module.walk())


def test_reverse_imports_and_round_trips_in_jax_pretty_form():
    """`stablehlo.reverse` (missing in xdsl-jax): JAX's text form parses, and
    partir prints it back the same way."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    module = partir.import_jax(lambda x: jnp.flip(x, (0, 2)), x)
    module.verify()
    (rev,) = [op for op in module.walk() if op.name == "stablehlo.reverse"]
    assert isinstance(rev, ReverseOp) and list(rev.dimensions.get_values()) == [0, 2]
    text = str(module)
    assert "stablehlo.reverse %x, dims = [0, 2] : tensor<2x3x4xf32>" in text
    jax_text = jax.jit(lambda x: jnp.flip(x, (0, 2))).lower(x).as_text()
    assert "stablehlo.reverse %arg0, dims = [0, 2] : tensor<2x3x4xf32>" in jax_text
    again = PartirParser(make_context(), text).parse_module()
    again.verify()
    assert str(again) == text
    (got,) = run_function(again, [x])
    np.testing.assert_array_equal(got, x[::-1, :, ::-1])


@pytest.mark.parametrize("dims", ["[2]", "[-1]", "[0, 0]"])
def test_reverse_verifier_rejects_bad_dims(dims):
    text = f"""
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {{
  %y = stablehlo.reverse %x, dims = {dims} : tensor<2x3xf32>
  func.return %y : tensor<2x3xf32>
}}
"""
    module = PartirParser(make_context(), text).parse_module()
    with pytest.raises(VerifyException, match=r"stablehlo.reverse: dims .* must be distinct dims"):
        module.verify()


def test_an_op_with_attributes_xdsl_cannot_read_still_imports():
    """`stablehlo.fft` carries `#stablehlo<fft_type FFT>`: kept opaque, named later."""
    from xdsl.utils.exceptions import InterpretationError

    from dialects.interpreter import run_function

    x = np.ones((4, 8), np.float32)
    module = partir.import_jax(lambda x: jnp.fft.fft(x).real, x)
    fft = [op for op in module.walk() if isinstance(op, UnregisteredOp)]
    assert [op.op_name.data for op in fft] == ["stablehlo.fft"]
    assert "fft_type FFT" in str(module)
    with pytest.raises(InterpretationError, match=r"stablehlo\.fft"):
        run_function(module, [x])


def test_complex_constants_import_and_run():
    from dialects.interpreter import run_function

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    module = partir.import_jax(lambda x: jnp.abs(x + 1j), x)
    (got,) = run_function(module, [x])
    np.testing.assert_allclose(got, np.abs(x + 1j), rtol=1e-6)


def test_attributes_read_part_by_part_equal_their_whole_text():
    """An op's arrays, dictionaries and function types are read part by part
    (`AttributeCache.convert`): each equals xDSL's reading of its whole text,
    on a program whose signature holds shardings, result names and nesting."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    from partir.importer import _CONTEXT
    from partir.mlir_bridge import AttributeCache

    mesh = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)

    def step(x, p):
        y = jax.lax.with_sharding_constraint(
            x @ p["w"], NamedSharding(mesh, PartitionSpec("batch", "model"))
        )
        return {"out": (y, jnp.sum(y)), "w": p["w"] * 2}

    args = (np.ones((8, 4), np.float32), {"w": np.ones((4, 6), np.float32)})
    in_shardings = (NamedSharding(mesh, PartitionSpec("batch")), {"w": NamedSharding(mesh, PartitionSpec())})
    lowered = jax.jit(step, in_shardings=in_shardings).lower(*args)
    cache = AttributeCache(_CONTEXT)
    composite, sharded = 0, 0
    pending = [lowered.compiler_ir("stablehlo").operation]
    while pending:
        op = pending.pop()
        for key in op.attributes:
            mlir_attr = op.attributes[key]
            whole = PartirParser(make_context(), str(mlir_attr)).parse_attribute()
            assert cache.convert(mlir_attr) == whole
            composite += str(mlir_attr).startswith(("[", "{", "("))
            sharded += str(mlir_attr).startswith("[") and "sharding" in str(mlir_attr)
        pending += [inner for region in op.regions for block in region for inner in block]
    assert composite >= 3  # the entry's signature, its arguments' and results' dictionaries
    assert sharded  # an argument's sharding, inside its dictionary
