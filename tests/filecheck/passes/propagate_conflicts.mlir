// RUN: partir-opt %s -p 'partir-declare-mesh{axes="x=4"},partir-tile{value=x dim=0 axis=x},partir-tile{value=y dim=1 axis=x},partir-propagate' | filecheck %s
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="x=4"},partir-tile{value=x dim=0 axis=x},partir-tile{value=y dim=1 axis=x}' | partir-opt -p partir-propagate | filecheck %s

// Two partir-tile passes tile x and y on different dims over the same axis;
// the add of x and y cannot follow both. Propagation lets the earlier action
// win and records the conflict on the module as a typed #partir.conflict,
// whichever pass runs it: in the same pipeline, or partir-propagate alone on
// the tiled module (the second RUN).

func.func @main(%x: tensor<8x8xf32> {partir.name = "x"}, %y: tensor<8x8xf32> {partir.name = "y"}) -> tensor<8x8xf32> {
  %s = stablehlo.add %x, %y : tensor<8x8xf32>
  func.return %s : tensor<8x8xf32>
}

// CHECK:      builtin.module attributes {
// CHECK-SAME:   partir.conflicts = [#partir.conflict<op = "stablehlo.add", axis = "x", values = ["x", "y"],
// CHECK-SAME:     winner = "action 1 (partir-tile of x)", loser = "action 2 (partir-tile of y)",
// CHECK-SAME:     detail = "operand 0 is tiled on dim 0, operand 1 on dim 1; the loser is redistributed">]
// CHECK:      %s = partir.loop "x" [#partir.tile<0>]
// CHECK:        stablehlo.add
// CHECK:      } {origin = #partir.origin<1, "partir-tile", "x">}
