// RUN: PARTIR_ROUNDTRIP
// RUN: partir-opt %s --print-op-generic --split-input-file | filecheck %s --check-prefix=GENERIC

// partir core IR: a mesh, and loops over its axes. A sum loop over "model"
// nested in a tile loop over "batch" (the Megatron MLP on a batch shard),
// each with the action that made it; slices name the range they index by.

builtin.module attributes {partir.actions = 2 : i64} {
  partir.mesh @mesh ["batch" = 4, "model" = 2]
  func.func @main(%w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>, %x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %y = partir.loop "batch" [#partir.tile<0>] (%b: !partir.range<4>) {
      %xs = partir.slice 0 %x[%b] : tensor<8x16xf32> -> tensor<2x16xf32>
      %s = partir.loop "model" [#partir.sum] (%m: !partir.range<2>) {
        %w1s = partir.slice 1 %w1[%m] : tensor<16x32xf32> -> tensor<16x16xf32>
        %h = stablehlo.dot_general %xs, %w1s, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x16xf32>) -> tensor<2x16xf32>
        %w2s = partir.slice 0 %w2[%m] : tensor<32x16xf32> -> tensor<16x16xf32>
        %o = stablehlo.dot_general %h, %w2s, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x16xf32>) -> tensor<2x16xf32>
        partir.yield %o : tensor<2x16xf32>
      } {origin = #partir.origin<2, "Megatron", "params['w1']">} : tensor<2x16xf32>
      partir.yield %s : tensor<2x16xf32>
    } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<8x16xf32>
    func.return %y : tensor<8x16xf32>
  }
}

// CHECK:      builtin.module attributes {partir.actions = 2 : i64} {
// CHECK-NEXT:   partir.mesh @mesh ["batch" = 4, "model" = 2]
// CHECK-NEXT:   func.func @main(%w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>, %x: tensor<8x16xf32>) -> tensor<8x16xf32> {
// CHECK-NEXT:     %y = partir.loop "batch" [#partir.tile<0>] (%b: !partir.range<4>) {
// CHECK-NEXT:       %xs = partir.slice 0 %x[%b] : tensor<8x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:       %s = partir.loop "model" [#partir.sum] (%m: !partir.range<2>) {
// CHECK-NEXT:         %w1s = partir.slice 1 %w1[%m] : tensor<16x32xf32> -> tensor<16x16xf32>
// CHECK-NEXT:         %h = stablehlo.dot_general %xs, %w1s, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT:         %w2s = partir.slice 0 %w2[%m] : tensor<32x16xf32> -> tensor<16x16xf32>
// CHECK-NEXT:         %o = stablehlo.dot_general %h, %w2s, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT:         partir.yield %o : tensor<2x16xf32>
// CHECK-NEXT:       } {origin = #partir.origin<2, "Megatron", "params['w1']">} : tensor<2x16xf32>
// CHECK-NEXT:       partir.yield %s : tensor<2x16xf32>
// CHECK-NEXT:     } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<8x16xf32>
// CHECK-NEXT:     func.return %y : tensor<8x16xf32>
// CHECK-NEXT:   }
// CHECK-NEXT: }

// In the generic form, the axis and the action are properties and the range
// is the loop body's block argument.
// GENERIC:      "partir.mesh"() <{sym_name = "mesh", axis_names = ["batch", "model"], axis_sizes = array<i64: 4, 2>}> : () -> ()
// GENERIC:      %y = "partir.loop"() <{axis = "batch", action = #partir.tile<0>}> ({
// GENERIC-NEXT: ^bb0(%b: !partir.range<4>):
// GENERIC-NEXT:   %xs = "partir.slice"(%x, %b) <{dim = 0 : i64}> : (tensor<8x16xf32>, !partir.range<4>) -> tensor<2x16xf32>
// GENERIC-NEXT:   %s = "partir.loop"() <{axis = "model", action = #partir.sum}> ({
// GENERIC:          "partir.yield"(%o) : (tensor<2x16xf32>) -> ()
// GENERIC-NEXT:   }) {origin = #partir.origin<2, "Megatron", "params['w1']">} : () -> tensor<2x16xf32>

// -----

// A loop nested in a loop over another axis may tile the same dim (the
// value is split over both axes, "batch" major).
partir.mesh @mesh ["batch" = 4, "model" = 2]
func.func @two_axes_one_dim(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
  %y = partir.loop "batch" [#partir.tile<0>] (%b: !partir.range<4>) {
    %xb = partir.slice 0 %x[%b] : tensor<16x4xf32> -> tensor<4x4xf32>
    %z = partir.loop "model" [#partir.tile<0>] (%m: !partir.range<2>) {
      %xm = partir.slice 0 %xb[%m] : tensor<4x4xf32> -> tensor<2x4xf32>
      %e = stablehlo.exponential %xm : tensor<2x4xf32>
      partir.yield %e : tensor<2x4xf32>
    } : tensor<4x4xf32>
    partir.yield %z : tensor<4x4xf32>
  } : tensor<16x4xf32>
  func.return %y : tensor<16x4xf32>
}

// CHECK:      //{{ }}-----
// CHECK:      func.func @two_axes_one_dim(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
// CHECK-NEXT:   %y = partir.loop "batch" [#partir.tile<0>] (%b: !partir.range<4>) {
// CHECK-NEXT:     %xb = partir.slice 0 %x[%b] : tensor<16x4xf32> -> tensor<4x4xf32>
// CHECK-NEXT:     %z = partir.loop "model" [#partir.tile<0>] (%m: !partir.range<2>) {
// CHECK-NEXT:       %xm = partir.slice 0 %xb[%m] : tensor<4x4xf32> -> tensor<2x4xf32>
// CHECK-NEXT:       %e = stablehlo.exponential %xm : tensor<2x4xf32>
// CHECK-NEXT:       partir.yield %e : tensor<2x4xf32>
// CHECK-NEXT:     } : tensor<4x4xf32>
// CHECK-NEXT:     partir.yield %z : tensor<4x4xf32>
// CHECK-NEXT:   } : tensor<16x4xf32>
// CHECK-NEXT:   func.return %y : tensor<16x4xf32>
// CHECK-NEXT: }
