// RUN: partir-opt %s -p 'partir-declare-mesh{axes="x=4"},partir-manual-partition{spec="x:0=x","y:0=x","result/0:0=x"},partir-lower-spmd' | filecheck %s

// partir-lower-spmd turns the loops into one per-device program, with the
// cheapest collective wherever a value's distribution changes. Here x, y and
// the first result are split on dim 0 over "x"; the program needs each kind:
//   all_to_all      transpose(x) is split on dim 1, the add needs dim 0;
//   reduce_scatter  the dot contracts the split dim (a partial sum), and the
//                   tiled result needs its rows;
//   all_gather      stablehlo.slice cannot be split, it needs x whole;
//   local_slice     its (replicated) result is added to the split y: no
//                   communication, each device keeps its rows;
//   all_reduce      the scalar sum is returned replicated.

func.func @main(%x: tensor<8x8xf32> {partir.name = "x"}, %y: tensor<4x8xf32> {partir.name = "y"}, %w: tensor<8x8xf32> {partir.name = "params['w']"}) -> (tensor<8x8xf32> {partir.name = "result[0]"}, tensor<4x8xf32> {partir.name = "result[1]"}, tensor<f32> {partir.name = "result[2]"}) {
  %t = stablehlo.transpose %x, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %s = stablehlo.add %x, %t : tensor<8x8xf32>
  %g = stablehlo.dot_general %x, %s, contracting_dims = [0] x [0] : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<8x8xf32>
  %r = stablehlo.slice %x [0:4, 0:8] : (tensor<8x8xf32>) -> tensor<4x8xf32>
  %q = stablehlo.add %r, %y : tensor<4x8xf32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %n = stablehlo.reduce(%s init: %zero) across dimensions = [0, 1] : (tensor<8x8xf32>, tensor<f32>) -> tensor<f32>
  reducer(%a: tensor<f32>, %b: tensor<f32>) {
    %ab = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %ab : tensor<f32>
  }
  func.return %w2, %q, %n : tensor<8x8xf32>, tensor<4x8xf32>, tensor<f32>
}

// The arguments and results have distributed types; the body works on parts.
// CHECK:       partir.mesh @mesh ["x" = 4]
// CHECK-NEXT:  func.func @main(%x: !spmd.dtensor<8x8xf32, [{"x"}, {}]> {partir.name = "x"}, %y: !spmd.dtensor<4x8xf32, [{"x"}, {}]> {partir.name = "y"}, %w: !spmd.dtensor<8x8xf32, [{"x"}, {}]> {partir.name = "params['w']"}) -> (!spmd.dtensor<8x8xf32, [{"x"}, {}]> {partir.name = "result[0]"}, !spmd.dtensor<4x8xf32, [{"x"}, {}]> {partir.name = "result[1]"}, !spmd.dtensor<f32, []> {partir.name = "result[2]"}) {
// CHECK-NEXT:    %[[X:.*]] = spmd.to_local %x {dist = !spmd.dtensor<8x8xf32, [{"x"}, {}]>} : !spmd.dtensor<8x8xf32, [{"x"}, {}]> -> tensor<2x8xf32>
// CHECK-NEXT:    %[[Y:.*]] = spmd.to_local %y {{.*}} -> tensor<1x8xf32>
// CHECK-NEXT:    %[[W:.*]] = spmd.to_local %w {{.*}} -> tensor<2x8xf32>

// CHECK-NEXT:    %[[T:.*]] = stablehlo.transpose %[[X]], dims = [1, 0] {dist = !spmd.dtensor<8x8xf32, [{}, {"x"}]>} : (tensor<2x8xf32>) -> tensor<8x2xf32>
// CHECK-NEXT:    %[[TT:.*]] = spmd.all_to_all %[[T]] split 0 concat 1 over ["x"] {{{.*}}dist = !spmd.dtensor<8x8xf32, [{"x"}, {}]>} : tensor<8x2xf32> -> tensor<2x8xf32>
// CHECK-NEXT:    %[[S:.*]] = stablehlo.add %[[X]], %[[TT]] {{.*}} : tensor<2x8xf32>

// CHECK-NEXT:    %[[G:.*]] = stablehlo.dot_general %[[X]], %[[S]], contracting_dims = [0] x [0] {dist = !spmd.dtensor<8x8xf32, [{}, {}], partial {"x"}>} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT:    %[[GS:.*]] = spmd.reduce_scatter %[[G]] dim 0 over ["x"] {{{.*}}origin = #partir.origin<3, "ManualPartition", "result[0]">{{.*}}} : tensor<8x8xf32> -> tensor<2x8xf32>
// CHECK-NEXT:    %[[W2:.*]] = stablehlo.subtract %[[W]], %[[GS]] {{.*}} : tensor<2x8xf32>

// CHECK-NEXT:    %[[XG:.*]] = spmd.all_gather %[[X]] dim 0 over ["x"] {needed_by = "stablehlo.slice", {{.*}}} : tensor<2x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %r = stablehlo.slice %[[XG]] [0:4, 0:8] {dist = !spmd.dtensor<4x8xf32, [{}, {}]>} : (tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %[[RL:.*]] = spmd.local_slice %r dim 0 over ["x"] {{.*}} : tensor<4x8xf32> -> tensor<1x8xf32>
// CHECK-NEXT:    %[[Q:.*]] = stablehlo.add %[[RL]], %[[Y]] {{.*}}: tensor<1x8xf32>

// CHECK:         %[[N:.*]] = stablehlo.reduce(%[[S]] init: %zero) across dimensions = [0, 1] {{.*}}partial {"x"}>} : (tensor<2x8xf32>, tensor<f32>) -> tensor<f32>
// CHECK:         %[[R0:.*]] = spmd.from_local %[[W2]] {{.*}}: tensor<2x8xf32> -> !spmd.dtensor<8x8xf32, [{"x"}, {}]>
// CHECK-NEXT:    %[[R1:.*]] = spmd.from_local %[[Q]] {{.*}}: tensor<1x8xf32> -> !spmd.dtensor<4x8xf32, [{"x"}, {}]>
// CHECK-NEXT:    %[[NR:.*]] = spmd.all_reduce %[[N]] over ["x"] {needed_by = "func.return", {{.*}}dist = !spmd.dtensor<f32, []>} : tensor<f32> -> tensor<f32>
// CHECK-NEXT:    %[[R2:.*]] = spmd.from_local %[[NR]] {{.*}}: tensor<f32> -> !spmd.dtensor<f32, []>
// CHECK-NEXT:    func.return %[[R0]], %[[R1]], %[[R2]] : !spmd.dtensor<8x8xf32, [{"x"}, {}]>, !spmd.dtensor<4x8xf32, [{"x"}, {}]>, !spmd.dtensor<f32, []>
