// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-declare-mesh{axes="batch=4","model=2"}' | filecheck %s
// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="batch=4"},partir-declare-mesh{axes="batch=2"}' 2>&1 | filecheck %s --check-prefix=CONFLICT

// partir-declare-mesh puts one partir.mesh at the top of the module; declaring
// the same mesh again is a no-op, a different one is an error.

func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %e = stablehlo.exponential %x : tensor<8x16xf32>
  func.return %e : tensor<8x16xf32>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   partir.mesh @mesh ["batch" = 4, "model" = 2]
// CHECK-NEXT:   func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
// CHECK-NEXT:     %e = stablehlo.exponential %x : tensor<8x16xf32>
// CHECK-NEXT:     func.return %e : tensor<8x16xf32>
// CHECK-NEXT:   }
// CHECK-NEXT: }
// CHECK-NOT:  partir.mesh

// CONFLICT: error: partir-declare-mesh: the module declares mesh {'batch': 4}, but {'batch': 2} was given
