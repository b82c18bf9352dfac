// REQUIRES: partir-inspect
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-manual-partition{spec="x:0=batch","params/w1:1=model"},partir-lower-spmd' | partir-inspect --format json - | filecheck %s

// partir-inspect reads a stage (here the SPMD stage, from stdin) and reports
// each value's global shape, distribution and S/B/P property per mesh axis,
// and each collective with its axes and bytes. The Megatron-style MLP on a
// batch shard needs one all-reduce over "model", of the [2, 16] f32 output
// part (128 bytes per device).

func.func @main(%w1: tensor<16x32xf32> {partir.name = "params['w1']"}, %w2: tensor<32x16xf32> {partir.name = "params['w2']"}, %x: tensor<8x16xf32> {partir.name = "x"}) -> (tensor<8x16xf32> {partir.name = "result"}) {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %a = stablehlo.tanh %h : tensor<8x32xf32>
  %y = stablehlo.dot_general %a, %w2, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  func.return %y : tensor<8x16xf32>
}

// CHECK:      "stage": "spmd",
// CHECK-NEXT: "mesh": {
// CHECK-NEXT:   "batch": 4,
// CHECK-NEXT:   "model": 2
// CHECK-NEXT: },

// The argument x: split over "batch" on dim 0, replicated over "model".
// CHECK:      "name": "%x",
// CHECK-NEXT: "op": "argument",
// CHECK-NEXT: "partir_name": "x",
// CHECK:      "properties": {
// CHECK-NEXT:   "batch": "S(0)",
// CHECK-NEXT:   "model": "B"
// CHECK-NEXT: },
// CHECK-NEXT: "local_shape": [
// CHECK-NEXT:   2,
// CHECK-NEXT:   16
// CHECK-NEXT: ],

// The second matmul's output: pending partial sums over "model".
// CHECK:      "op": "stablehlo.dot_general",
// CHECK:      "op": "stablehlo.dot_general",
// CHECK:      "partial": [
// CHECK-NEXT:   "model"
// CHECK-NEXT: ],
// CHECK-NEXT: "properties": {
// CHECK-NEXT:   "batch": "S(0)",
// CHECK-NEXT:   "model": "P"
// CHECK-NEXT: },

// CHECK:      "collectives": [
// CHECK-NEXT:   {
// CHECK-NEXT:     "name": "{{%[0-9]+}}",
// CHECK-NEXT:     "kind": "all_reduce",
// CHECK-NEXT:     "axes": [
// CHECK-NEXT:       "model"
// CHECK-NEXT:     ],
// CHECK-NEXT:     "operand": "tensor<2x16xf32>",
// CHECK-NEXT:     "result": "tensor<2x16xf32>",
// CHECK-NEXT:     "bytes_per_device": 128,
// CHECK-NEXT:     "needed_by": "func.return",
// CHECK:        }
// CHECK-NEXT: ],
// CHECK-NEXT: "bytes_communicated_per_device": 128,
