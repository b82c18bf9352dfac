// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-annotations' | filecheck %s
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-annotations,partir-lower-spmd' | filecheck %s --check-prefix=SPMD

// x is typed split over "batch" (explicit mode); the constraint on it
// changes that (`jax.sharding.reshard(x, P(None, None))`), so
// partir-annotations keeps it, marked partir.reshard: its result is a value
// of its own, whole, which propagation does not cross. The SPMD lowering
// gathers x there, as jax.jit does, and the sine runs on the whole value.

sdy.mesh @mesh = <["batch"=4, "model"=2]>
func.func @main(%x: tensor<8x6xf32> {partir.name = "x", sdy.sharding = #sdy.sharding<@mesh, [{"batch"}, {}]>}) -> (tensor<8x6xf32> {partir.name = "result"}) {
  %y = sdy.sharding_constraint %x <@mesh, [{}, {}]> : tensor<8x6xf32>
  %s = stablehlo.sine %y : tensor<8x6xf32>
  func.return %s : tensor<8x6xf32>
}

// CHECK:       %x_1 = partir.loop "batch" [#partir.tile<0>]
// CHECK:       } {origin = #partir.origin<1, "Annotations", "x">}
// CHECK-NEXT:  %y = sdy.sharding_constraint %x_1 <@mesh, [{}, {}]> {partir.reshard} : tensor<8x6xf32>
// CHECK-NEXT:  %s = stablehlo.sine %y : tensor<8x6xf32>

// SPMD:        spmd.all_gather %{{.*}} dim 0 over ["batch"]
// SPMD-SAME:   tensor<2x6xf32> -> tensor<8x6xf32>
// SPMD-NEXT:   stablehlo.sine %{{.*}} {dist = !spmd.dtensor<8x6xf32, [{}, {}]>} : tensor<8x6xf32>
// SPMD-NOT:    sdy.
