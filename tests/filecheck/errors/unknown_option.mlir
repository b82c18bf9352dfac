// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="x=4"},partir-zero{axis=x stages=2}' 2>&1 | filecheck %s

// A misspelt option of a pass lists the options the pass has.

func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  func.return %x : tensor<8xf32>
}

// CHECK-NOT:  Traceback
// CHECK:      error: partir-zero: no option stages (did you mean stage?); the options are {axis=required stage=3 params=none opt-state=none updates=none}
// CHECK-NOT:  Traceback
