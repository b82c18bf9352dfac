// partir-tile{value=0}: an unquoted index (xDSL reads it as an int) selects argument 0.
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="x=4"},partir-tile{value=0 dim=0 axis=x}' | filecheck %s

// `partir-opt --help` shows `partir-tile{value=0 dim=0 axis=}`; writing value=0
// must work as shown, like value="0" or a name (see tile.mlir).

func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  func.return %x : tensor<8x16xf32>
}

// CHECK:      partir.loop "x" [#partir.tile<0>]
// CHECK-NEXT:   partir.slice 0 %x
