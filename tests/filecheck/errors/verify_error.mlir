// RUN: not partir-opt %s 2>&1 | filecheck %s

// The verifier runs on the parsed input (and after every pass). A failure
// prints one line, the verifier's message and the op it is about, then exits with 1.
// Here the loop's range has 2 values, but the axis "x" has 4 devices.

partir.mesh @mesh ["x" = 4]
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %l = partir.loop "x" [#partir.tile<0>] (%r: !partir.range<2>) {
    %s = partir.slice 0 %x[%r] : tensor<8xf32> -> tensor<4xf32>
    partir.yield %s : tensor<4xf32>
  } : tensor<8xf32>
  func.return %l : tensor<8xf32>
}

// CHECK-NOT:  Traceback
// CHECK:      error: range size 2 of loop over "x" differs from the axis size 4; in: %l = "partir.loop"() <{axis = "x", action = #partir.tile<0>}> ({
// CHECK-NOT:  Traceback
