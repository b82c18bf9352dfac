// RUN: PARTIR_ROUNDTRIP

// The SPMD stage: one per-device program. Arguments and results have
// distributed types !spmd.dtensor<global type, per-dim axes, partial axes>;
// spmd.to_local / spmd.from_local cross between them and the local tensors
// the body computes on; every collective names the mesh axes it runs over.
// The lowering annotates each op with its result's distribution (`dist`),
// and each collective with the op that needed it and the action behind it.

partir.mesh @mesh ["batch" = 4, "model" = 2]
func.func @main(%x: !spmd.dtensor<16x8xf32, [{"batch"}, {}]>, %w: !spmd.dtensor<8x8xf32, [{}, {"model"}]>, %p: !spmd.dtensor<16x8xf32, [{}, {}], partial {"batch", "model"}>) -> (!spmd.dtensor<16x8xf32, [{"batch", "model"}, {}]>, !spmd.dtensor<16x8xf32, [{}, {"model"}]>) {
  %xl = spmd.to_local %x : !spmd.dtensor<16x8xf32, [{"batch"}, {}]> -> tensor<4x8xf32>
  %wl = spmd.to_local %w : !spmd.dtensor<8x8xf32, [{}, {"model"}]> -> tensor<8x4xf32>
  %pl = spmd.to_local %p : !spmd.dtensor<16x8xf32, [{}, {}], partial {"batch", "model"}> -> tensor<16x8xf32>
  %h = stablehlo.dot_general %xl, %wl, contracting_dims = [1] x [0] {dist = !spmd.dtensor<16x8xf32, [{"batch"}, {"model"}]>} : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  %a2a = spmd.all_to_all %h split 0 concat 1 over ["model"] : tensor<4x4xf32> -> tensor<2x8xf32>
  %g = spmd.all_gather %h dim 0 over ["batch"] {needed_by = "partir.slice 0 over \22model\22", origin = #partir.origin<1, "BatchParallel", "x">, dist = !spmd.dtensor<16x8xf32, [{}, {"model"}]>} : tensor<4x4xf32> -> tensor<16x4xf32>
  %ar = spmd.all_reduce %pl over ["batch"] : tensor<16x8xf32> -> tensor<16x8xf32>
  %rs = spmd.reduce_scatter %ar dim 1 over ["model"] : tensor<16x8xf32> -> tensor<16x4xf32>
  %sum = stablehlo.add %g, %rs : tensor<16x4xf32>
  %ls = spmd.local_slice %sum dim 0 over ["batch", "model"] : tensor<16x4xf32> -> tensor<2x4xf32>
  %r0 = spmd.from_local %a2a : tensor<2x8xf32> -> !spmd.dtensor<16x8xf32, [{"batch", "model"}, {}]>
  %r1 = spmd.from_local %sum : tensor<16x4xf32> -> !spmd.dtensor<16x8xf32, [{}, {"model"}]>
  func.return %r0, %r1 : !spmd.dtensor<16x8xf32, [{"batch", "model"}, {}]>, !spmd.dtensor<16x8xf32, [{}, {"model"}]>
}

// CHECK:      partir.mesh @mesh ["batch" = 4, "model" = 2]
// CHECK-NEXT: func.func @main(%x: !spmd.dtensor<16x8xf32, [{"batch"}, {}]>, %w: !spmd.dtensor<8x8xf32, [{}, {"model"}]>, %p: !spmd.dtensor<16x8xf32, [{}, {}], partial {"batch", "model"}>) -> (!spmd.dtensor<16x8xf32, [{"batch", "model"}, {}]>, !spmd.dtensor<16x8xf32, [{}, {"model"}]>) {
// CHECK-NEXT:   %xl = spmd.to_local %x : !spmd.dtensor<16x8xf32, [{"batch"}, {}]> -> tensor<4x8xf32>
// CHECK-NEXT:   %wl = spmd.to_local %w : !spmd.dtensor<8x8xf32, [{}, {"model"}]> -> tensor<8x4xf32>
// CHECK-NEXT:   %pl = spmd.to_local %p : !spmd.dtensor<16x8xf32, [{}, {}], partial {"batch", "model"}> -> tensor<16x8xf32>
// CHECK-NEXT:   %h = stablehlo.dot_general %xl, %wl, contracting_dims = [1] x [0] {dist = !spmd.dtensor<16x8xf32, [{"batch"}, {"model"}]>} : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
// CHECK-NEXT:   %a2a = spmd.all_to_all %h split 0 concat 1 over ["model"] : tensor<4x4xf32> -> tensor<2x8xf32>
// CHECK-NEXT:   %g = spmd.all_gather %h dim 0 over ["batch"] {needed_by = "partir.slice 0 over \22model\22", origin = #partir.origin<1, "BatchParallel", "x">, dist = !spmd.dtensor<16x8xf32, [{}, {"model"}]>} : tensor<4x4xf32> -> tensor<16x4xf32>
// CHECK-NEXT:   %ar = spmd.all_reduce %pl over ["batch"] : tensor<16x8xf32> -> tensor<16x8xf32>
// CHECK-NEXT:   %rs = spmd.reduce_scatter %ar dim 1 over ["model"] : tensor<16x8xf32> -> tensor<16x4xf32>
// CHECK-NEXT:   %sum = stablehlo.add %g, %rs : tensor<16x4xf32>
// CHECK-NEXT:   %ls = spmd.local_slice %sum dim 0 over ["batch", "model"] : tensor<16x4xf32> -> tensor<2x4xf32>
// CHECK-NEXT:   %r0 = spmd.from_local %a2a : tensor<2x8xf32> -> !spmd.dtensor<16x8xf32, [{"batch", "model"}, {}]>
// CHECK-NEXT:   %r1 = spmd.from_local %sum : tensor<16x4xf32> -> !spmd.dtensor<16x8xf32, [{}, {"model"}]>
// CHECK-NEXT:   func.return %r0, %r1 : !spmd.dtensor<16x8xf32, [{"batch", "model"}, {}]>, !spmd.dtensor<16x8xf32, [{}, {"model"}]>
// CHECK-NEXT: }

