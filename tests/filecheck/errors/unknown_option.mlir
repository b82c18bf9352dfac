// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="x=4"},partir-zero{axis=x stages=2}' 2>&1 | filecheck %s

// A misspelt option of a pass lists the options the pass has.

func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  func.return %x : tensor<8xf32>
}

// CHECK-NOT:  Traceback
// CHECK:      error: Provided arguments ["stages"] not found in expected arguments ["axis", "stage", "params", "opt_state", "updates"]
// CHECK-NOT:  Traceback
