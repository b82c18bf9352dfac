// A tile loop sliced twice by the same range is one slice, so the loop fuses.
// RUN: partir-opt %s -p partir-propagate | filecheck %s

// `%a` has two uses, two identical slices in the same loop; propagation makes
// them one (DedupeSlice), so the single-use fusion applies. An op that uses a
// tiled value twice (`x * x` in GELU) produces such pairs.

partir.mesh @mesh ["x" = 4]
func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %a = partir.loop "x" [#partir.tile<0>] (%r: !partir.range<4>) {
    %s = partir.slice 0 %x[%r] : tensor<8x16xf32> -> tensor<2x16xf32>
    %e = stablehlo.exponential %s : tensor<2x16xf32>
    partir.yield %e : tensor<2x16xf32>
  } : tensor<8x16xf32>
  %b = partir.loop "x" [#partir.tile<0>] (%q: !partir.range<4>) {
    %s1 = partir.slice 0 %a[%q] : tensor<8x16xf32> -> tensor<2x16xf32>
    %s2 = partir.slice 0 %a[%q] : tensor<8x16xf32> -> tensor<2x16xf32>
    %m = stablehlo.multiply %s1, %s2 : tensor<2x16xf32>
    partir.yield %m : tensor<2x16xf32>
  } : tensor<8x16xf32>
  func.return %b : tensor<8x16xf32>
}

// CHECK-LABEL: func.func @main
// CHECK-NEXT:    %b = partir.loop "x" [#partir.tile<0>] (%q: !partir.range<4>) {
// CHECK-NEXT:      %[[S:.*]] = partir.slice 0 %x[%q] : tensor<8x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:      %[[E:.*]] = stablehlo.exponential %[[S]] : tensor<2x16xf32>
// CHECK-NEXT:      %[[M:.*]] = stablehlo.multiply %[[E]], %[[E]] : tensor<2x16xf32>
// CHECK-NEXT:      partir.yield %[[M]] : tensor<2x16xf32>
// CHECK-NEXT:    } : tensor<8x16xf32>
// CHECK-NOT:     partir.loop
