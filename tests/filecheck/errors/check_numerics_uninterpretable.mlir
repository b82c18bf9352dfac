// RUN: not partir-opt %s --allow-unregistered-dialect -p 'partir-declare-mesh{axes="x=2"}' --check-numerics 2>&1 | filecheck %s

// --check-numerics needs the input to run on the reference interpreter; an op
// it has no semantics for is named, with the way out.

func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = "stablehlo.frobnicate"(%x) : (tensor<8xf32>) -> tensor<8xf32>
  func.return %y : tensor<8xf32>
}

// CHECK-NOT:  Traceback
// CHECK:      error: --check-numerics: cannot run the original program on the reference interpreter (the reference interpreter has no implementation of stablehlo.frobnicate (an op partir's dialects do not define)); run without --check-numerics
