// RUN: partir-opt %s -p inline-calls | filecheck %s

// inline-calls inlines every func.call (JAX emits one per jax.nn function,
// custom_jvp and pjit) and erases the private functions left unused; the
// entry function keeps its name and signature. Each call gets its own copy of
// the callee's body.

func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @relu(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = func.call @relu(%0) : (tensor<4xf32>) -> tensor<4xf32>
  func.return %1 : tensor<4xf32>
}
func.func private @relu(%a: tensor<4xf32>) -> tensor<4xf32> {
  %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
  %m = stablehlo.maximum %a, %z : tensor<4xf32>
  func.return %m : tensor<4xf32>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
// CHECK-NEXT:     %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK-NEXT:     %m = stablehlo.maximum %x, %z : tensor<4xf32>
// CHECK-NEXT:     %z_1 = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK-NEXT:     %m_1 = stablehlo.maximum %m, %z_1 : tensor<4xf32>
// CHECK-NEXT:     func.return %m_1 : tensor<4xf32>
// CHECK-NEXT:   }
// CHECK-NEXT: }
