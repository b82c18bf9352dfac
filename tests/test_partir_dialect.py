"""The partir core dialect: syntax round trips and every verifier rule."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.utils.exceptions import ParseError, VerifyException

from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.parser import PartirParser
from dialects.partir import LoopOp, MeshOp, RangeType, SliceOp, TileAttr

NESTED = """\
builtin.module {
  partir.mesh @mesh ["batch" = 4, "model" = 2]
  func.func @main(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xf32> {
    %y = partir.loop "batch" [#partir.tile<0>] (%r: !partir.range<4>) {
      %xs = partir.slice 0 %x[%r] : tensor<32x64xf32> -> tensor<8x64xf32>
      %z = partir.loop "model" [#partir.sum] (%q: !partir.range<2>) {
        %a = partir.slice 1 %xs[%q] : tensor<8x64xf32> -> tensor<8x32xf32>
        %b = partir.slice 0 %w[%q] : tensor<64x16xf32> -> tensor<32x16xf32>
        %m = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
        partir.yield %m : tensor<8x16xf32>
      } : tensor<8x16xf32>
      partir.yield %z : tensor<8x16xf32>
    } {tactic = "BatchParallel"} : tensor<32x16xf32>
    func.return %y : tensor<32x16xf32>
  }
}
"""


def parse(text: str):
    return PartirParser(make_context(), text, "test.mlir").parse_module()


def verify_error(text: str) -> str:
    module = parse(text)
    with pytest.raises(VerifyException) as info:
        module.verify()
    return str(info.value)


def test_nested_loops_print_parse_fixed_point():
    module = parse(NESTED)
    module.verify()
    assert str(module) == NESTED.rstrip("\n")
    again = parse(str(module))
    assert str(again) == str(module)


def test_generic_form_parses_back_to_the_same_module():
    from io import StringIO

    from xdsl.printer import Printer

    module = parse(NESTED)
    buffer = StringIO()
    Printer(stream=buffer, print_generic_format=True).print_op(module)
    generic = buffer.getvalue()
    assert '"partir.loop"() <{axis = "batch", action = #partir.tile<0>}>' in generic
    assert str(parse(generic)) == str(module)


def test_mesh_accessors():
    module = parse(NESTED)
    mesh = next(op for op in module.body.block.ops if isinstance(op, MeshOp))
    assert mesh.axes == {"batch": 4, "model": 2}
    loop = next(op for op in module.walk() if isinstance(op, LoopOp))
    assert loop.axis_name == "batch" and isinstance(loop.action, TileAttr)


def _loop(axis: str, range_size: int, body: str, action: str = "#partir.tile<0>",
          result: str = "tensor<8x4xf32>", mesh: str = '["x" = 4, "y" = 2]') -> str:
    return f"""
partir.mesh @mesh {mesh}
func.func @main(%v: tensor<8x4xf32>) -> {result} {{
  %l = partir.loop "{axis}" [{action}] (%r: !partir.range<{range_size}>) {{
{body}
  }} : {result}
  func.return %l : {result}
}}"""


SLICE_X = """    %s = partir.slice 0 %v[%r] : tensor<8x4xf32> -> tensor<2x4xf32>
    partir.yield %s : tensor<2x4xf32>"""


def test_valid_tile_and_sum_loops_verify():
    parse(_loop("x", 4, SLICE_X)).verify()
    body = "    partir.yield %v : tensor<8x4xf32>"
    parse(_loop("y", 2, body, action="#partir.sum")).verify()


def test_range_size_must_equal_axis_size():
    body = """    %s = partir.slice 0 %v[%r] : tensor<8x4xf32> -> tensor<4x4xf32>
    partir.yield %s : tensor<4x4xf32>"""
    assert verify_error(_loop("x", 2, body)) == (
        'range size 2 of loop over "x" differs from the axis size 4'
    )


def test_unknown_axis_is_an_error():
    assert verify_error(_loop("z", 4, SLICE_X)) == (
        'unknown mesh axis "z": mesh @mesh declares "x", "y"'
    )


def test_loop_needs_a_mesh():
    text = _loop("x", 4, SLICE_X).replace('partir.mesh @mesh ["x" = 4, "y" = 2]', "")
    assert verify_error(text) == (
        'loop over "x" needs a partir.mesh declaration at the top of its module'
    )


def test_same_axis_nested_twice_is_an_error():
    body = """    %inner = partir.loop "x" [#partir.tile<0>] (%q: !partir.range<4>) {
      %s = partir.slice 0 %v[%q] : tensor<8x4xf32> -> tensor<2x4xf32>
      partir.yield %s : tensor<2x4xf32>
    } : tensor<8x4xf32>
    partir.yield %inner : tensor<8x4xf32>"""
    text = _loop("x", 4, body, action="#partir.sum")
    assert verify_error(text) == 'loop over "x" is nested inside another loop over the same axis'


def test_tile_result_shape_must_be_body_shape_times_axis():
    assert verify_error(_loop("x", 4, SLICE_X, result="tensor<4x4xf32>")) == (
        'tile<0> loop over "x" of tensor<2x4xf32> gives shape 8x4, but the result is '
        "tensor<4x4xf32>"
    )


def test_sum_result_must_equal_body_type():
    assert verify_error(_loop("x", 4, SLICE_X, action="#partir.sum")) == (
        'sum loop over "x" yields tensor<2x4xf32> but its result is tensor<8x4xf32>'
    )


def test_tile_dim_must_exist():
    assert verify_error(_loop("x", 4, SLICE_X, action="#partir.tile<2>")) == (
        'loop over "x" tiles dim 2 of the rank-2 value tensor<2x4xf32>'
    )


def test_slice_index_must_be_an_enclosing_loop_range():
    text = """
partir.mesh @mesh ["x" = 4]
func.func @main(%v: tensor<8x4xf32>, %r: !partir.range<4>) -> tensor<2x4xf32> {
  %s = partir.slice 0 %v[%r] : tensor<8x4xf32> -> tensor<2x4xf32>
  func.return %s : tensor<2x4xf32>
}"""
    assert verify_error(text) == "slice index must be the range of an enclosing partir.loop"


def test_slice_result_shape_is_checked():
    # The custom syntax infers the range from the types, so use the generic form.
    text = """
partir.mesh @mesh ["x" = 4]
func.func @main(%v: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %l = partir.loop "x" [#partir.tile<1>] (%r: !partir.range<4>) {
    %s = "partir.slice"(%v, %r) <{dim = 0 : i64}> : (tensor<8x4xf32>, !partir.range<4>) -> tensor<8x1xf32>
    partir.yield %s : tensor<8x1xf32>
  } : tensor<8x4xf32>
  func.return %l : tensor<8x4xf32>
}"""
    assert verify_error(text) == (
        "slice 0 of tensor<8x4xf32> over 4 parts gives tensor<2x4xf32>, "
        "but the result is tensor<8x1xf32>"
    )


def test_slice_dim_must_divide():
    text = """
partir.mesh @mesh ["x" = 4]
func.func @main(%v: tensor<6x4xf32>) -> tensor<6x4xf32> {
  %l = partir.loop "x" [#partir.tile<1>] (%r: !partir.range<4>) {
    %s = "partir.slice"(%v, %r) <{dim = 0 : i64}> : (tensor<6x4xf32>, !partir.range<4>) -> tensor<6x1xf32>
    partir.yield %s : tensor<6x1xf32>
  } : tensor<6x4xf32>
  func.return %l : tensor<6x4xf32>
}"""
    assert verify_error(text) == 'dim 0 of tensor<6x4xf32> is not divisible by the size 4 of axis "x"'


def test_uneven_slice_text_is_a_parse_error_with_location():
    text = _loop("x", 4, SLICE_X).replace("tensor<2x4xf32>\n", "tensor<3x4xf32>\n", 1)
    with pytest.raises(ParseError) as info:
        parse(text)
    assert "is not an even split of dim 0" in str(info.value)
    assert "test.mlir:" in str(info.value)


def test_mesh_rules():
    assert verify_error('partir.mesh @m ["x" = 2, "x" = 4]') == (
        "mesh @m repeats an axis name: ['x', 'x']"
    )
    assert verify_error('partir.mesh @m ["x" = 0]') == 'mesh axis "x" must have a positive size, got 0'
    assert verify_error('partir.mesh @m ["x" = 2]\npartir.mesh @n ["y" = 2]') == (
        "a module declares one partir.mesh; found @m, @n"
    )


def test_yield_must_be_inside_a_loop():
    text = """
func.func @main(%v: tensor<8x4xf32>) {
  partir.yield %v : tensor<8x4xf32>
}"""
    assert "expects parent op 'partir.loop'" in verify_error(text)


def test_range_type_rejects_non_positive_sizes():
    with pytest.raises(VerifyException, match="range size must be positive, got 0"):
        RangeType(0)


def test_slice_builder_infers_its_type():
    module = parse(_loop("x", 4, SLICE_X))
    slice_op = next(op for op in module.walk() if isinstance(op, SliceOp))
    rebuilt = SliceOp(slice_op.src, 0, slice_op.index)
    assert rebuilt.result.type == slice_op.result.type


HALO_X = """    %s = partir.halo_slice 0 %v[%r] halo [1, 2] : tensor<8x4xf32> -> tensor<5x4xf32>
    partir.yield %s : tensor<5x4xf32>"""


def test_halo_slice_round_trips_and_runs_with_zeros_past_the_edges():
    module = parse(_loop("x", 4, HALO_X, result="tensor<20x4xf32>"))
    module.verify()
    assert str(parse(str(module))) == str(module)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    (got,) = run_function(module, [x])
    padded = np.pad(x, [(1, 2), (0, 0)])
    want = np.concatenate([padded[2 * r: 2 * r + 5] for r in range(4)])
    np.testing.assert_array_equal(got, want)


def test_a_halo_wider_than_a_part_is_an_error():
    body = HALO_X.replace("halo [1, 2]", "halo [3, 0]")
    assert verify_error(_loop("x", 4, body, result="tensor<20x4xf32>")) == (
        "halo_slice halo [3, 0] is wider than a part (2 elements): it would reach past a neighbour"
    )


def test_a_halo_slice_of_the_wrong_size_is_a_parse_error():
    body = HALO_X.replace("-> tensor<5x4xf32>", "-> tensor<6x4xf32>")
    with pytest.raises(ParseError, match="is not an even split of dim 0 plus its halo"):
        parse(_loop("x", 4, body, result="tensor<20x4xf32>"))
