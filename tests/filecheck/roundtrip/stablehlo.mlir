// RUN: PARTIR_ROUNDTRIP
// RUN: partir-opt %s --print-op-generic --split-input-file | filecheck %s --check-prefix=GENERIC

// The StableHLO stage, as partir.import_jax prints it: printed generic,
// parsed back and printed again, it is unchanged. A float with no decimal
// form is printed as its bits (0xff800000 is -inf), and read back as the
// same float, not as the integer 4286578688.

func.func public @main(%x: tensor<4x8xf32> {partir.name = "x"}, %w: tensor<8x16xf32> {partir.name = "params['w']"}) -> (tensor<4xi32> {jax.result_info = "result[0]", partir.name = "result[0]"}, tensor<4x16xf32>) {
  %0 = stablehlo.iota dim = 1 : tensor<4x8xi32>
  %1 = stablehlo.constant dense<0xff800000> : tensor<f32>
  %2 = stablehlo.constant dense<0> : tensor<i32>
  %3, %4 = stablehlo.reduce(%x init: %1), (%0 init: %2) across dimensions = [1] : (tensor<4x8xf32>, tensor<4x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<4xf32>, tensor<4xi32>)
  reducer(%5: tensor<f32>, %6: tensor<f32>) (%7: tensor<i32>, %8: tensor<i32>) {
    %9 = stablehlo.compare GT, %5, %6, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %10 = stablehlo.select %9, %5, %6 : tensor<i1>, tensor<f32>
    %11 = stablehlo.select %9, %7, %8 : tensor<i1>, tensor<i32>
    stablehlo.return %10, %11 : tensor<f32>, tensor<i32>
  }
  %12 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  %13 = stablehlo.broadcast_in_dim %3, dims = [0] : (tensor<4xf32>) -> tensor<4x16xf32>
  %14 = stablehlo.subtract %12, %13 : tensor<4x16xf32>
  %15 = stablehlo.transpose %14, dims = [1, 0] : (tensor<4x16xf32>) -> tensor<16x4xf32>
  %16 = stablehlo.reshape %15 : (tensor<16x4xf32>) -> tensor<4x16xf32>
  %17 = stablehlo.slice %16 [0:4, 0:16:2] : (tensor<4x16xf32>) -> tensor<4x8xf32>
  %18 = stablehlo.concatenate %17, %17, dim = 1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
  %19 = stablehlo.convert %4 : (tensor<4xi32>) -> tensor<4xf32>
  %20 = chlo.erf %18 : tensor<4x16xf32> -> tensor<4x16xf32>
  func.return %4, %20 : tensor<4xi32>, tensor<4x16xf32>
}

// CHECK:      func.func public @main(%x: tensor<4x8xf32> {partir.name = "x"}, %w: tensor<8x16xf32> {partir.name = "params['w']"}) -> (tensor<4xi32> {jax.result_info = "result[0]", partir.name = "result[0]"}, tensor<4x16xf32>) {
// CHECK-NEXT:   %0 = stablehlo.iota dim = 1 : tensor<4x8xi32>
// CHECK-NEXT:   %1 = stablehlo.constant dense<0xff800000> : tensor<f32>
// CHECK-NEXT:   %2 = stablehlo.constant dense<0> : tensor<i32>
// CHECK-NEXT:   %3, %4 = stablehlo.reduce(%x init: %1), (%0 init: %2) across dimensions = [1] : (tensor<4x8xf32>, tensor<4x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<4xf32>, tensor<4xi32>)
// CHECK-NEXT:   reducer(%5: tensor<f32>, %6: tensor<f32>) (%7: tensor<i32>, %8: tensor<i32>) {
// CHECK-NEXT:     %9 = stablehlo.compare GT, %5, %6, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
// CHECK-NEXT:     %10 = stablehlo.select %9, %5, %6 : tensor<i1>, tensor<f32>
// CHECK-NEXT:     %11 = stablehlo.select %9, %7, %8 : tensor<i1>, tensor<i32>
// CHECK-NEXT:     stablehlo.return %10, %11 : tensor<f32>, tensor<i32>
// CHECK-NEXT:   }
// CHECK-NEXT:   %12 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:   %13 = stablehlo.broadcast_in_dim %3, dims = [0] : (tensor<4xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:   %14 = stablehlo.subtract %12, %13 : tensor<4x16xf32>
// CHECK-NEXT:   %15 = stablehlo.transpose %14, dims = [1, 0] : (tensor<4x16xf32>) -> tensor<16x4xf32>
// CHECK-NEXT:   %16 = stablehlo.reshape %15 : (tensor<16x4xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:   %17 = stablehlo.slice %16 [0:4, 0:16:2] : (tensor<4x16xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:   %18 = stablehlo.concatenate %17, %17, dim = 1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:   %19 = stablehlo.convert %4 : (tensor<4xi32>) -> tensor<4xf32>
// CHECK-NEXT:   %20 = chlo.erf %18 : tensor<4x16xf32> -> tensor<4x16xf32>
// CHECK-NEXT:   func.return %4, %20 : tensor<4xi32>, tensor<4x16xf32>
// CHECK-NEXT: }

// The reduce with two inputs: four operands, a reducer block whose arguments
// are the two accumulators, then the two elements.
// GENERIC:      %3, %4 = "stablehlo.reduce"(%x, %0, %1, %2) <{dimensions = array<i64: 1>}> ({
// GENERIC-NEXT: ^bb0(%5: tensor<f32>, %6: tensor<i32>, %7: tensor<f32>, %8: tensor<i32>):
// GENERIC-NEXT:   %9 = "stablehlo.compare"(%5, %7) <{comparison_direction = #stablehlo<comparison_direction GT>, compare_type = #stablehlo<comparison_type FLOAT>}> : (tensor<f32>, tensor<f32>) -> tensor<i1>
// GENERIC:        "stablehlo.return"(%10, %11) : (tensor<f32>, tensor<i32>) -> ()
// GENERIC-NEXT: }) : (tensor<4x8xf32>, tensor<4x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<4xf32>, tensor<4xi32>)
