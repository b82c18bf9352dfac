// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-annotations' | filecheck %s
// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="data=4","model=2"},partir-annotations' 2>&1 | filecheck %s --check-prefix=OTHER-MESH
// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-lower-spmd,partir-emit-jax' 2>&1 | filecheck %s --check-prefix=NOT-APPLIED

// partir-annotations makes the shardings the program states (JAX's sdy
// dialect) tiling actions: x's explicit-mode sharding splits its rows over
// "batch", the constraint on the tanh splits its columns over "model". The
// constraint, the argument's sdy.sharding and JAX's mesh are gone after it.
// Emitted without the pass, the constraint is refused, not dropped.
// What an annotation keeps whole stays marked (partir.whole_dims): x's
// batch split reaches %a's rows, which the constraint keeps whole, and is
// a reported conflict, not silently resolved.

sdy.mesh @mesh = <["batch"=4, "model"=2]>
func.func @main(%x: tensor<8x16xf32> {partir.name = "x", sdy.sharding = #sdy.sharding<@mesh, [{"batch"}, {}]>}, %w: tensor<16x8xf32> {partir.name = "w"}) -> (tensor<8x8xf32> {partir.name = "result"}) {
  %h = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  %a = stablehlo.tanh %h : tensor<8x8xf32>
  %c = sdy.sharding_constraint %a <@mesh, [{}, {"model"}]> : tensor<8x8xf32>
  func.return %c : tensor<8x8xf32>
}

// CHECK-NOT:   sdy.
// CHECK:       partir.conflicts = [#partir.conflict<op = "annotation", axis = "batch", values = ["%a"], winner = "action 1 (Annotations of x)", loser = "a sharding constraint with no location", detail = "P(None, 'model') keeps dim 0 whole
// CHECK:       func.func @main(%x: tensor<8x16xf32> {partir.name = "x", partir.whole_dims = {{\[\[}}#builtin.int<1>], "argument sharding", "P('batch', None)"]}
// CHECK-NEXT:    %a = partir.loop "model" [#partir.tile<1>]
// CHECK-NEXT:      partir.loop "batch" [#partir.tile<0>]
// CHECK:             stablehlo.tanh %{{.*}} : tensor<2x4xf32>
// CHECK:           } {origin = #partir.origin<1, "Annotations", "x">}
// CHECK:         } {origin = #partir.origin<2, "Annotations", "%a">}
// CHECK-NOT:   sdy.

// OTHER-MESH: error: Annotations: argument sharding splits x as P('batch', None) on JAX's mesh @mesh ("batch"=4, "model"=2), whose axis "batch"=4 partir's mesh ("data"=4, "model"=2) does not have

// NOT-APPLIED: cannot emit sdy.sharding_constraint {{.*}} the annotation was not applied; run the partir-annotations pass
