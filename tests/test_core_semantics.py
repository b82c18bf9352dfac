"""Hand-written core IR: tile and sum loops interpret to the plain op's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.parser import PartirParser
from tests.numerics import assert_close

MATMUL_SPLIT = """
partir.mesh @mesh ["rows" = 4, "k" = 2]
func.func @main(%x: tensor<16x12xf32>, %w: tensor<12x6xf32>) -> tensor<16x6xf32> {
  %y = partir.loop "rows" [#partir.tile<0>] (%r: !partir.range<4>) {
    %xs = partir.slice 0 %x[%r] : tensor<16x12xf32> -> tensor<4x12xf32>
    %z = partir.loop "k" [#partir.sum] (%q: !partir.range<2>) {
      %a = partir.slice 1 %xs[%q] : tensor<4x12xf32> -> tensor<4x6xf32>
      %b = partir.slice 0 %w[%q] : tensor<12x6xf32> -> tensor<6x6xf32>
      %m = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x6xf32>, tensor<6x6xf32>) -> tensor<4x6xf32>
      partir.yield %m : tensor<4x6xf32>
    } : tensor<4x6xf32>
    partir.yield %z : tensor<4x6xf32>
  } : tensor<16x6xf32>
  func.return %y : tensor<16x6xf32>
}
"""

# The same product with the nesting the other way round and a column tile.
SUM_OUTSIDE = """
partir.mesh @mesh ["cols" = 3, "k" = 2]
func.func @main(%x: tensor<16x12xf32>, %w: tensor<12x6xf32>) -> tensor<16x6xf32> {
  %y = partir.loop "k" [#partir.sum] (%q: !partir.range<2>) {
    %a = partir.slice 1 %x[%q] : tensor<16x12xf32> -> tensor<16x6xf32>
    %t = partir.loop "cols" [#partir.tile<1>] (%r: !partir.range<3>) {
      %b = partir.slice 0 %w[%q] : tensor<12x6xf32> -> tensor<6x6xf32>
      %c = partir.slice 1 %b[%r] : tensor<6x6xf32> -> tensor<6x2xf32>
      %m = stablehlo.dot_general %a, %c, contracting_dims = [1] x [0] : (tensor<16x6xf32>, tensor<6x2xf32>) -> tensor<16x2xf32>
      %e = stablehlo.exponential %m : tensor<16x2xf32>
      partir.yield %m : tensor<16x2xf32>
    } : tensor<16x6xf32>
    partir.yield %t : tensor<16x6xf32>
  } : tensor<16x6xf32>
  func.return %y : tensor<16x6xf32>
}
"""


@pytest.mark.parametrize("text", [MATMUL_SPLIT, SUM_OUTSIDE], ids=["tile-of-sum", "sum-of-tile"])
def test_loops_compute_the_plain_matmul(text: str):
    module = PartirParser(make_context(), text).parse_module()
    module.verify()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 12)).astype(np.float32)
    w = rng.standard_normal((12, 6)).astype(np.float32)
    (got,) = run_function(module, [x, w])
    assert_close(got, x @ w)


def test_tile_loop_concatenates_and_sum_loop_adds_in_order():
    text = """
partir.mesh @mesh ["a" = 4]
func.func @main(%x: tensor<8x3xi32>) -> (tensor<8x3xi32>, tensor<2x3xi32>) {
  %t = partir.loop "a" [#partir.tile<0>] (%r: !partir.range<4>) {
    %s = partir.slice 0 %x[%r] : tensor<8x3xi32> -> tensor<2x3xi32>
    %n = stablehlo.negate %s : tensor<2x3xi32>
    partir.yield %n : tensor<2x3xi32>
  } : tensor<8x3xi32>
  %u = partir.loop "a" [#partir.sum] (%r: !partir.range<4>) {
    %s = partir.slice 0 %x[%r] : tensor<8x3xi32> -> tensor<2x3xi32>
    partir.yield %s : tensor<2x3xi32>
  } : tensor<2x3xi32>
  func.return %t, %u : tensor<8x3xi32>, tensor<2x3xi32>
}
"""
    module = PartirParser(make_context(), text).parse_module()
    module.verify()
    x = np.arange(24, dtype=np.int32).reshape(8, 3)
    tiled, summed = run_function(module, [x])
    np.testing.assert_array_equal(tiled, -x)
    np.testing.assert_array_equal(summed, x.reshape(4, 2, 3).sum(axis=0))
    assert summed.dtype == np.int32
