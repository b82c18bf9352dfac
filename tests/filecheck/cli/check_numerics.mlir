// RUN: sh -c 'partir-opt %s -p "partir-declare-mesh{axes=\"x=4\",\"y=2\"},partir-tile{value=x dim=0 axis=x},partir-tile{value=x dim=1 axis=y},partir-propagate,partir-lower-spmd" --check-numerics; echo "exit status $?"' 2>&1 | filecheck %s

// --check-numerics is translation validation: the input module runs on the
// reference interpreter on seeded random inputs (here the index %i stays
// below 13, so that the 4-row window it starts lies inside %table), and after
// every pass the module runs again on the same inputs (the SPMD stage on the
// interpreter that simulates each of the 8 devices). A pass that changes an
// output stops the pipeline with one line naming it; these passes keep the
// numbers, so the output is the SPMD module and the status 0.

func.func @main(%x: tensor<8x16xf32> {partir.name = "x"}, %w: tensor<16x4xf32> {partir.name = "w"}, %table: tensor<16x4xf32> {partir.name = "table"}, %i: tensor<i32> {partir.name = "i"}) -> tensor<8x4xf32> {
  %e = stablehlo.exponential %x : tensor<8x16xf32>
  %y = stablehlo.dot_general %e, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %t = stablehlo.tanh %y : tensor<8x4xf32>
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %win = stablehlo.dynamic_slice %table, %i, %zero, sizes = [4, 4] : (tensor<16x4xf32>, tensor<i32>, tensor<i32>) -> tensor<4x4xf32>
  %m = stablehlo.dot_general %t, %win, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  func.return %m : tensor<8x4xf32>
}

// CHECK-NOT:  error
// CHECK:      spmd.all_reduce
// CHECK:      exit status 0
