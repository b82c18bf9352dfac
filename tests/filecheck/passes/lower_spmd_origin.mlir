// A collective over an inner loop's axis is attributed to that loop's action.
// RUN: partir-opt %s -p partir-lower-spmd | filecheck %s

// The sum over "model" (action 2, the tiling of w1) is nested in the tile
// loop over "batch" (action 1, the tiling of x). The all-reduce over "model"
// exists because of action 2, but partir-lower-spmd records the origin of
// the outermost loop the value leaves (to_spmd.py: `op.origin or
// yielded.origin`), so it says action 1, and partir-inspect's "caused by"
// column blames the batch tiling of x.

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
    } {origin = #partir.origin<2, "ManualPartition", "params['w1']">} : tensor<2x16xf32>
    partir.yield %s : tensor<2x16xf32>
  } {origin = #partir.origin<1, "ManualPartition", "x">} : tensor<8x16xf32>
  func.return %y : tensor<8x16xf32>
}

// CHECK: spmd.all_reduce %{{.*}} over ["model"] {needed_by = "func.return", origin = #partir.origin<2, "ManualPartition", "params['w1']">
