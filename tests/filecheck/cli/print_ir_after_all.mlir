// RUN: partir-opt %s -p 'inline-calls,canonicalize,cse,partir-declare-mesh{axes="x=2"}' --print-ir-after-all -o %t 2>&1 | filecheck %s
// RUN: filecheck %s --input-file %t --check-prefix=OUT

// --print-ir-after-all prints the module to stderr after every pass, the last
// one included, so a pipeline can be followed step by step; the result still
// goes to stdout (here to -o %t). xDSL's own passes mix with partir's:
// canonicalize drops the dead exponential, cse merges the two constants that
// inline-calls copied.

func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %dead = stablehlo.exponential %x : tensor<4xf32>
  %0 = func.call @relu(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = func.call @relu(%0) : (tensor<4xf32>) -> tensor<4xf32>
  func.return %1 : tensor<4xf32>
}
func.func private @relu(%a: tensor<4xf32>) -> tensor<4xf32> {
  %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
  %m = stablehlo.maximum %a, %z : tensor<4xf32>
  func.return %m : tensor<4xf32>
}

// CHECK:      // -----// IR after inline-calls //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
// CHECK-NEXT:     %dead = stablehlo.exponential %x : tensor<4xf32>
// CHECK-NEXT:     %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK-NEXT:     %m = stablehlo.maximum %x, %z : tensor<4xf32>
// CHECK-NEXT:     %z_1 = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK-NEXT:     %m_1 = stablehlo.maximum %m, %z_1 : tensor<4xf32>
// CHECK-NEXT:     func.return %m_1 : tensor<4xf32>
// CHECK-NEXT:   }
// CHECK-NEXT: }
// CHECK-NEXT: // -----// IR after canonicalize //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
// CHECK-NEXT:     %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK-NEXT:     %m = stablehlo.maximum %x, %z : tensor<4xf32>
// CHECK-NEXT:     %z_1 = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK:      // -----// IR after cse //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
// CHECK-NEXT:     %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK-NEXT:     %m = stablehlo.maximum %x, %z : tensor<4xf32>
// CHECK-NEXT:     %m_1 = stablehlo.maximum %m, %z : tensor<4xf32>
// CHECK-NEXT:     func.return %m_1 : tensor<4xf32>
// CHECK-NEXT:   }
// CHECK-NEXT: }
// CHECK-NEXT: // -----// IR after partir-declare-mesh //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   partir.mesh @mesh ["x" = 2]
// CHECK-NEXT:   func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
// CHECK-NOT:  IR after

// OUT:      builtin.module {
// OUT-NEXT:   partir.mesh @mesh ["x" = 2]
// OUT-NEXT:   func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
// OUT-NEXT:     %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// OUT-NEXT:     %m = stablehlo.maximum %x, %z : tensor<4xf32>
// OUT-NEXT:     %m_1 = stablehlo.maximum %m, %z : tensor<4xf32>
// OUT-NEXT:     func.return %m_1 : tensor<4xf32>
// OUT-NEXT:   }
// OUT-NEXT: }
