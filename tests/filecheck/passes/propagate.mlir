// RUN: partir-opt %s -p partir-propagate --split-input-file | filecheck %s

// partir-propagate on partir core IR written by hand.

// Backward: %e is used only through a slice, so the slice moves to its
// operand and the exponential is computed per part, inside the loop.
partir.mesh @mesh ["x" = 4]
func.func @backward(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %e = stablehlo.exponential %x : tensor<8x16xf32>
  %l = partir.loop "x" [#partir.tile<0>] (%r: !partir.range<4>) {
    %s = partir.slice 0 %e[%r] : tensor<8x16xf32> -> tensor<2x16xf32>
    partir.yield %s : tensor<2x16xf32>
  } : tensor<8x16xf32>
  func.return %l : tensor<8x16xf32>
}

// CHECK-LABEL: func.func @backward(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
// CHECK-NEXT:    %l = partir.loop "x" [#partir.tile<0>] (%r: !partir.range<4>) {
// CHECK-NEXT:      %[[S:.*]] = partir.slice 0 %x[%r] : tensor<8x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:      %[[E:.*]] = stablehlo.exponential %[[S]] : tensor<2x16xf32>
// CHECK-NEXT:      partir.yield %[[E]] : tensor<2x16xf32>
// CHECK-NEXT:    } : tensor<8x16xf32>
// CHECK-NEXT:    func.return %l : tensor<8x16xf32>

// -----

// Forward and fusion: the slice of the first loop's result is the first
// loop's body (slice-of-tile fusion), and the negate joins the loop.
partir.mesh @mesh ["x" = 4]
func.func @fusion(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %a = partir.loop "x" [#partir.tile<0>] (%r: !partir.range<4>) {
    %s = partir.slice 0 %x[%r] : tensor<8x16xf32> -> tensor<2x16xf32>
    %e = stablehlo.exponential %s : tensor<2x16xf32>
    partir.yield %e : tensor<2x16xf32>
  } : tensor<8x16xf32>
  %b = partir.loop "x" [#partir.tile<0>] (%q: !partir.range<4>) {
    %s = partir.slice 0 %a[%q] : tensor<8x16xf32> -> tensor<2x16xf32>
    %t = stablehlo.tanh %s : tensor<2x16xf32>
    partir.yield %t : tensor<2x16xf32>
  } : tensor<8x16xf32>
  %n = stablehlo.negate %b : tensor<8x16xf32>
  func.return %n : tensor<8x16xf32>
}

// CHECK-LABEL: func.func @fusion(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
// CHECK-NEXT:    %n = partir.loop "x" [#partir.tile<0>] (%q: !partir.range<4>) {
// CHECK-NEXT:      %[[S:.*]] = partir.slice 0 %x[%q] : tensor<8x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:      %[[E:.*]] = stablehlo.exponential %[[S]] : tensor<2x16xf32>
// CHECK-NEXT:      %[[T:.*]] = stablehlo.tanh %[[E]] : tensor<2x16xf32>
// CHECK-NEXT:      %[[N:.*]] = stablehlo.negate %[[T]] : tensor<2x16xf32>
// CHECK-NEXT:      partir.yield %[[N]] : tensor<2x16xf32>
// CHECK-NEXT:    } : tensor<8x16xf32>
// CHECK-NEXT:    func.return %n : tensor<8x16xf32>
