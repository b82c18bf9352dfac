// RUN: partir-opt %examples/mlp_train_step.mlir -p 'partir-declare-mesh{axes="batch=4"},partir-batch-parallel{axis=batch}' -o %t
// RUN: filecheck %s --input-file %t
// RUN: filecheck %s --input-file %t --check-prefix=PARAMS

// partir-batch-parallel on the MLP training step (examples/mlp_train_step.py):
// the data arguments x and y are tiled on dim 0 (the parameters are not), and
// propagation carries the tiling through the forward pass; every reduction
// over the batch (the loss, each weight gradient) becomes a sum loop.

// What the tactic chose for each argument and why is recorded on the module:
// the parameters are state (the step returns them updated), x and y data.
// CHECK:       builtin.module @jit_program attributes {{{.*}}partir.actions = 2 : i64, partir.selections = [
// CHECK-SAME:    #partir.selection<tactic = "BatchParallel(batch)", role = "state", dim = none, axis = "", reason = "returned updated as result/1", leaves = ["params['b1']", "params['b2']", "params['w1']", "params['w2']"]>,
// CHECK-SAME:    #partir.selection<tactic = "BatchParallel(batch)", role = "data", dim = 0, axis = "batch", reason = "not returned updated; shares leading dim 16 with y", leaves = ["x"]>,
// CHECK-SAME:    #partir.selection<tactic = "BatchParallel(batch)", role = "data", dim = 0, axis = "batch", reason = "not returned updated; shares leading dim 16 with x", leaves = ["y"]>]} {
// CHECK-NEXT:    partir.mesh @mesh ["batch" = 4]
// CHECK-LABEL:   func.func public @main(%params_b1: tensor<64xf32> {partir.name = "params['b1']"}
// The first layer, on a quarter of the batch:
// CHECK-NEXT:      %[[B1:.*]] = stablehlo.broadcast_in_dim %params_b1, dims = [1] : (tensor<64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT:      %{{.*}} = partir.loop "batch" [#partir.tile<0>] (%[[R:.*]]: !partir.range<4>) {
// CHECK-NEXT:        %[[X:.*]] = partir.slice 0 %x[%[[R]]] : tensor<16x32xf32> -> tensor<4x32xf32>
// CHECK-NEXT:        %{{.*}} = stablehlo.dot_general %[[X]], %params_w1, {{.*}} : (tensor<4x32xf32>, tensor<32x64xf32>) -> tensor<4x64xf32>
// CHECK-NEXT:        %{{.*}} = stablehlo.broadcast_in_dim %[[B1]], dims = [0, 1] : (tensor<1x64xf32>) -> tensor<4x64xf32>
// CHECK-NEXT:        %[[H:.*]] = stablehlo.add
// CHECK-NEXT:        partir.yield %[[H]] : tensor<4x64xf32>
// CHECK-NEXT:      } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<16x64xf32>
// The targets are sliced to match the predictions:
// CHECK:           partir.slice 0 %y[%{{.*}}] : tensor<16x16xf32> -> tensor<4x16xf32>
// The loss, and each gradient, sums the per-device parts (the weight
// gradients come out transposed, as JAX computes them):
// CHECK:           partir.loop "batch" [#partir.sum]
// CHECK:           } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<f32>
// CHECK:           partir.loop "batch" [#partir.sum]
// CHECK:           } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<16xf32>
// CHECK:           partir.loop "batch" [#partir.sum]
// CHECK:           } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<16x64xf32>
// CHECK:           partir.loop "batch" [#partir.sum]
// CHECK:           } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<64xf32>
// CHECK:           partir.loop "batch" [#partir.sum]
// CHECK:           } {origin = #partir.origin<1, "BatchParallel", "x">} : tensor<64x32xf32>
// CHECK-NOT:       partir.loop
// CHECK:           func.return

// The parameters themselves are never sliced:
// PARAMS-NOT: partir.slice {{[0-9]+}} %params
