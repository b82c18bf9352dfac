// RUN: not partir-opt %s 2>&1 | filecheck %s

// A syntax error is one line: its file:line:col, the parser's message and the
// text it stopped at, and partir-opt exits with a non-zero status (exactly 1,
// see exit_code.mlir) without a Python traceback.

func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = stablehlo.exponential %x : tensor<8xf32>
  func.return %y tensor<8xf32>
}

// CHECK-NOT:  Traceback
// CHECK:      {{.*}}parse_error.mlir:[[# @LINE - 4]]:18: error: Expected ':' (at 'tensor')
// CHECK-NOT:  {{.}}
