// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4"},partir-zero{axis=batch stage=1}' | filecheck %s --check-prefix=STAGE1
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4"},partir-zero{axis=batch stage=3}' | filecheck %s --check-prefix=STAGE3
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4"},partir-zero{axis=batch stage=1},partir-lower-spmd' | filecheck %s --check-prefix=SPMD1

// partir-zero on a momentum-SGD update. Stage 1 shards the optimizer state
// (opt_state/**) on dim 0: the state update runs on a quarter of the rows, and
// so does the parameter update that reads it. The bias, which the state does
// not touch, stays whole. Stage 3 also shards what the step returns (stage 2)
// and the parameters: the bias update is computed by row blocks too (pulled
// backward from the tiled result).

func.func @main(%w: tensor<8x4xf32> {partir.name = "params['w']"}, %b: tensor<8xf32> {partir.name = "params['b']"}, %m: tensor<8x4xf32> {partir.name = "opt_state['m']"}, %g: tensor<8x4xf32> {partir.name = "grads['w']"}, %gb: tensor<8xf32> {partir.name = "grads['b']"}) -> (tensor<8x4xf32> {partir.name = "result[0]['w']"}, tensor<8xf32> {partir.name = "result[0]['b']"}, tensor<8x4xf32> {partir.name = "result[1]['m']"}) {
  %m2 = stablehlo.add %m, %g : tensor<8x4xf32>
  %w2 = stablehlo.subtract %w, %m2 : tensor<8x4xf32>
  %b2 = stablehlo.subtract %b, %gb : tensor<8xf32>
  func.return %w2, %b2, %m2 : tensor<8x4xf32>, tensor<8xf32>, tensor<8x4xf32>
}

// What ZeRO chose and why is recorded on the module (partir-inspect shows it):
// STAGE1:      builtin.module attributes {partir.actions = 1 : i64, partir.selections = [#partir.selection<tactic = "ZeRO-1(batch)", role = "optimizer state", dim = 0, axis = "batch", reason = "under opt_state, named as optimizer state", leaves = ["opt_state['m']"]>,
// STAGE1-SAME:   #partir.selection<tactic = "ZeRO-1(batch)", role = "updated parameter", dim = none, axis = "batch", reason = "returned whole as the parameters came (ZeRO-2 returns them split)", leaves = ["result[0]['w']", "result[0]['b']"]>]} {
// The updated parameters return whole, as they came (the lowering gathers them):
// STAGE1-LABEL:  func.func @main
// STAGE1-SAME:     -> (tensor<8x4xf32> {partir.name = "result[0]['w']", partir.whole_over = ["batch"]}
// STAGE1-NEXT:     %m2 = partir.loop "batch" [#partir.tile<0>] (%[[R:.*]]: !partir.range<4>) {
// STAGE1-NEXT:       %[[M:.*]] = partir.slice 0 %m[%[[R]]] : tensor<8x4xf32> -> tensor<2x4xf32>
// STAGE1-NEXT:       %[[G:.*]] = partir.slice 0 %g[%[[R]]] : tensor<8x4xf32> -> tensor<2x4xf32>
// STAGE1-NEXT:       %[[M2:.*]] = stablehlo.add %[[M]], %[[G]] : tensor<2x4xf32>
// STAGE1-NEXT:       partir.yield %[[M2]] : tensor<2x4xf32>
// STAGE1-NEXT:     } {origin = #partir.origin<1, "ZeRO", "opt_state['m']">} : tensor<8x4xf32>
// STAGE1-NEXT:     %w2 = partir.loop "batch" [#partir.tile<0>] (%[[Q:.*]]: !partir.range<4>) {
// STAGE1-NEXT:       %[[W:.*]] = partir.slice 0 %w[%[[Q]]] : tensor<8x4xf32> -> tensor<2x4xf32>
// STAGE1-NEXT:       %[[MS:.*]] = partir.slice 0 %m2[%[[Q]]] : tensor<8x4xf32> -> tensor<2x4xf32>
// STAGE1-NEXT:       %[[W2:.*]] = stablehlo.subtract %[[W]], %[[MS]] : tensor<2x4xf32>
// STAGE1-NEXT:       partir.yield %[[W2]] : tensor<2x4xf32>
// STAGE1-NEXT:     } {origin = #partir.origin<1, "ZeRO", "opt_state['m']">} : tensor<8x4xf32>
// STAGE1-NEXT:     %b2 = stablehlo.subtract %b, %gb : tensor<8xf32>
// STAGE1-NEXT:     func.return %w2, %b2, %m2

// STAGE3:      builtin.module attributes {partir.actions = 6 : i64, partir.selections = [
// STAGE3-SAME:   #partir.selection<tactic = "ZeRO-3(batch)", role = "parameter", dim = 0, axis = "batch", reason = "under params: returned updated as result/0, and no optimizer state mirrors it", leaves = ["params['w']", "params['b']"]>,
// STAGE3-SAME:   #partir.selection<tactic = "ZeRO-3(batch)", role = "optimizer state", dim = 0, axis = "batch", reason = "under opt_state, named as optimizer state", leaves = ["opt_state['m']"]>,
// STAGE3-SAME:   #partir.selection<tactic = "ZeRO-3(batch)", role = "update", dim = 0, axis = "batch", reason = "returned by the step", leaves = ["result[0]['w']", "result[0]['b']", "result[1]['m']"]>]} {
// STAGE3-LABEL:  func.func @main
// STAGE3:          %b2 = partir.loop "batch" [#partir.tile<0>] (%[[R:.*]]: !partir.range<4>) {
// STAGE3-NEXT:       %[[B:.*]] = partir.slice 0 %b[%[[R]]] : tensor<8xf32> -> tensor<2xf32>
// STAGE3-NEXT:       %[[GB:.*]] = partir.slice 0 %gb[%[[R]]] : tensor<8xf32> -> tensor<2xf32>
// STAGE3-NEXT:       %[[B2:.*]] = stablehlo.subtract %[[B]], %[[GB]] : tensor<2xf32>
// STAGE3-NEXT:       partir.yield %[[B2]] : tensor<2xf32>
// STAGE3-NEXT:     } {origin = #partir.origin<3, "ZeRO", "result[0]['b']">} : tensor<8xf32>
// STAGE3-NEXT:     func.return %w2, %b2, %m2

// Lowered, stage 1 gathers the parameter update before the return; the
// optimizer state returns split:
// SPMD1:       %[[W2:.*]] = stablehlo.subtract %w_1, %{{.*}} {dist = !spmd.dtensor<8x4xf32, [{"batch"}, {}]>} : tensor<2x4xf32>
// SPMD1:       %[[G:.*]] = spmd.all_gather %[[W2]] dim 0 over ["batch"] {needed_by = "func.return"
// SPMD1:       func.return %{{.*}} : !spmd.dtensor<8x4xf32, [{}, {}]>, !spmd.dtensor<8xf32, [{}]>, !spmd.dtensor<8x4xf32, [{"batch"}, {}]>
