// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-manual-partition{spec="x:0=batch","params/w1:1=model"}' | filecheck %s
// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="batch=4"},partir-manual-partition{spec="x=batch"}' 2>&1 | filecheck %s --check-prefix=BAD-SPEC

// partir-manual-partition tiles exactly what the spec names, one
// selector:dim=axis entry each, selecting arguments by their pytree path. The batch
// tiling of x and the model tiling of w1 (the hidden dim) give a sum loop over
// "model" nested in a tile loop over "batch": the hidden dim is contracted by
// the second matmul.

func.func @main(%w1: tensor<16x32xf32> {partir.name = "params['w1']"}, %w2: tensor<32x16xf32> {partir.name = "params['w2']"}, %x: tensor<8x16xf32> {partir.name = "x"}) -> (tensor<8x16xf32> {partir.name = "result"}) {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %a = stablehlo.tanh %h : tensor<8x32xf32>
  %y = stablehlo.dot_general %a, %w2, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  func.return %y : tensor<8x16xf32>
}

// CHECK-LABEL: func.func @main
// CHECK-NEXT:    %y = partir.loop "batch" [#partir.tile<0>] (%[[B:.*]]: !partir.range<4>) {
// CHECK-NEXT:      %[[X:.*]] = partir.slice 0 %x[%[[B]]] : tensor<8x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:      %[[S:.*]] = partir.loop "model" [#partir.sum] (%[[M:.*]]: !partir.range<2>) {
// CHECK-NEXT:        %[[W1:.*]] = partir.slice 1 %w1[%[[M]]] : tensor<16x32xf32> -> tensor<16x16xf32>
// CHECK-NEXT:        %[[H:.*]] = stablehlo.dot_general %[[X]], %[[W1]], {{.*}} -> tensor<2x16xf32>
// CHECK-NEXT:        %[[A:.*]] = stablehlo.tanh %[[H]] : tensor<2x16xf32>
// CHECK-NEXT:        %[[W2:.*]] = partir.slice 0 %w2[%[[M]]] : tensor<32x16xf32> -> tensor<16x16xf32>
// CHECK-NEXT:        %[[Y:.*]] = stablehlo.dot_general %[[A]], %[[W2]], {{.*}} -> tensor<2x16xf32>
// CHECK-NEXT:        partir.yield %[[Y]] : tensor<2x16xf32>
// CHECK-NEXT:      } {origin = #partir.origin<2, "ManualPartition", "params['w1']">} : tensor<2x16xf32>
// CHECK-NEXT:      partir.yield %[[S]] : tensor<2x16xf32>
// CHECK-NEXT:    } {origin = #partir.origin<1, "ManualPartition", "x">} : tensor<8x16xf32>
// CHECK-NEXT:    func.return %y : tensor<8x16xf32>

// BAD-SPEC: error: partir-manual-partition: cannot read "x=batch"; write selector:dim=axis, e.g. spec="x:0=batch","params/w1:1=model"
