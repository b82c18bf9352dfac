// RUN: partir-opt %s -p 'partir-declare-mesh{axes="x=4","y=2"},partir-tile{value="0" dim=0 axis=x}' | filecheck %s --check-prefix=TILE
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="x=4","y=2"},partir-tile{value=x dim=0 axis=x},partir-propagate' | filecheck %s --check-prefix=FORWARD
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="x=4","y=2"},partir-tile{value=x dim=1 axis=y},partir-propagate' | filecheck %s --check-prefix=SUM

// partir-tile names an argument by index (quoted: value="0", see
// tile_index_unquoted.mlir) or by its partir.name, and tiles one of its dims
// over a mesh axis: a loop of slices (TILE), nothing else moves.
// partir-propagate then pushes the loop forward through every op that can be
// tiled the same way, fusing them into one loop (FORWARD). Tiling the
// contracted dim of the dot gives a sum loop, and the dot's other operand is
// sliced to match (the sideways step); tanh is not linear, so it stays
// outside the sum (SUM).

func.func @main(%x: tensor<8x16xf32> {partir.name = "x"}, %w: tensor<16x4xf32> {partir.name = "w"}) -> tensor<8x4xf32> {
  %e = stablehlo.exponential %x : tensor<8x16xf32>
  %y = stablehlo.dot_general %e, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %t = stablehlo.tanh %y : tensor<8x4xf32>
  func.return %t : tensor<8x4xf32>
}

// TILE:      builtin.module attributes {partir.actions = 1 : i64, partir.selections = [#partir.selection<tactic = "partir-tile(x)", role = "named", dim = 0, axis = "x", reason = "value=0", leaves = ["x"]>]} {
// TILE-NEXT:   partir.mesh @mesh ["x" = 4, "y" = 2]
// TILE-LABEL:  func.func @main
// TILE-NEXT:     %[[XT:.*]] = partir.loop "x" [#partir.tile<0>] (%[[R:.*]]: !partir.range<4>) {
// TILE-NEXT:       %[[S:.*]] = partir.slice 0 %x[%[[R]]] : tensor<8x16xf32> -> tensor<2x16xf32>
// TILE-NEXT:       partir.yield %[[S]] : tensor<2x16xf32>
// TILE-NEXT:     } {origin = #partir.origin<1, "partir-tile", "x">} : tensor<8x16xf32>
// TILE-NEXT:     %e = stablehlo.exponential %[[XT]] : tensor<8x16xf32>
// TILE-NEXT:     %y = stablehlo.dot_general %e, %w, {{.*}} -> tensor<8x4xf32>
// TILE-NEXT:     %t = stablehlo.tanh %y : tensor<8x4xf32>
// TILE-NEXT:     func.return %t : tensor<8x4xf32>

// FORWARD-LABEL: func.func @main
// FORWARD-NEXT:    %t = partir.loop "x" [#partir.tile<0>] (%[[R:.*]]: !partir.range<4>) {
// FORWARD-NEXT:      %[[S:.*]] = partir.slice 0 %x[%[[R]]] : tensor<8x16xf32> -> tensor<2x16xf32>
// FORWARD-NEXT:      %[[E:.*]] = stablehlo.exponential %[[S]] : tensor<2x16xf32>
// FORWARD-NEXT:      %[[Y:.*]] = stablehlo.dot_general %[[E]], %w, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x4xf32>) -> tensor<2x4xf32>
// FORWARD-NEXT:      %[[T:.*]] = stablehlo.tanh %[[Y]] : tensor<2x4xf32>
// FORWARD-NEXT:      partir.yield %[[T]] : tensor<2x4xf32>
// FORWARD-NEXT:    } {origin = #partir.origin<1, "partir-tile", "x">} : tensor<8x4xf32>
// FORWARD-NEXT:    func.return %t : tensor<8x4xf32>

// SUM-LABEL: func.func @main
// SUM-NEXT:    %y = partir.loop "y" [#partir.sum] (%[[R:.*]]: !partir.range<2>) {
// SUM-NEXT:      %[[S:.*]] = partir.slice 1 %x[%[[R]]] : tensor<8x16xf32> -> tensor<8x8xf32>
// SUM-NEXT:      %[[E:.*]] = stablehlo.exponential %[[S]] : tensor<8x8xf32>
// SUM-NEXT:      %[[W:.*]] = partir.slice 0 %w[%[[R]]] : tensor<16x4xf32> -> tensor<8x4xf32>
// SUM-NEXT:      %[[Y:.*]] = stablehlo.dot_general %[[E]], %[[W]], contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
// SUM-NEXT:      partir.yield %[[Y]] : tensor<8x4xf32>
// SUM-NEXT:    } {origin = #partir.origin<1, "partir-tile", "x">} : tensor<8x4xf32>
// SUM-NEXT:    %t = stablehlo.tanh %y : tensor<8x4xf32>
// SUM-NEXT:    func.return %t : tensor<8x4xf32>
