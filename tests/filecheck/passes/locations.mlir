// REQUIRES: partir-inspect
// RUN: partir-opt %s --print-debuginfo -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-manual-partition{spec="x:0=batch","params/w1:0=model"},partir-lower-spmd' -o %t.mlir
// RUN: filecheck %s --input-file %t.mlir --check-prefix=SPMD
// RUN: partir-opt %t.mlir --print-debuginfo | partir-opt --print-debuginfo | filecheck %s --check-prefix=SPMD
// RUN: partir-opt %t.mlir -p partir-emit-jax | filecheck %s --check-prefix=JAX
// RUN: partir-inspect %t.mlir | filecheck %s --check-prefix=INSPECT
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-manual-partition{spec="x:0=batch","params/w1:0=model"},partir-lower-spmd' | filecheck %s --check-prefix=PLAIN

// Each op keeps where the user's code made it (JAX's name stack and the
// innermost frame: `loc("jit(mlp)/tanh"("mlp"("model.py":4:8)))`) through
// tiling and the SPMD lowering; the all-reduce of the first matmul's partial
// sums takes the location of the tanh that needs it whole. --print-debuginfo
// prints the locations, which parse back; without it the IR reads as ever.
// The emitted program ends each statement with `file:line name/stack`, and
// partir-inspect puts the location next to the collective's provenance.

func.func @main(%w1: tensor<16x32xf32> {partir.name = "params['w1']"}, %w2: tensor<32x16xf32> {partir.name = "params['w2']"}, %x: tensor<8x16xf32> {partir.name = "x"}) -> (tensor<8x16xf32> {partir.name = "result"}) {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32> loc("jit(mlp)/dot_general"("mlp"("model.py":3:8)))
  %a = stablehlo.tanh %h : tensor<8x32xf32> loc("jit(mlp)/tanh"("mlp"("model.py":4:8)))
  %y = stablehlo.dot_general %a, %w2, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32> loc("jit(mlp)/dot_general"("mlp"("model.py":5:11)))
  func.return %y : tensor<8x16xf32> loc("jit(mlp)")
}

// SPMD:      stablehlo.dot_general {{.*}} loc("jit(mlp)/dot_general"("mlp"("model.py":3:8)))
// SPMD-NEXT: spmd.all_reduce {{.*}} {needed_by = "stablehlo.tanh", {{.*}} loc("jit(mlp)/tanh"("mlp"("model.py":4:8)))
// SPMD-NEXT: stablehlo.tanh {{.*}} loc("jit(mlp)/tanh"("mlp"("model.py":4:8)))
// SPMD-NEXT: stablehlo.dot_general {{.*}} loc("jit(mlp)/dot_general"("mlp"("model.py":5:11)))

// JAX-LABEL: def _body(a0, a1, a2):
// JAX:       = lax.dot_general({{.*}})  # model.py:3 jit(mlp)/dot_general
// JAX-NEXT:  = lax.psum({{.*}})  # model.py:4 jit(mlp)/tanh
// JAX-NEXT:  = lax.tanh({{.*}})  # model.py:4 jit(mlp)/tanh
// JAX-NEXT:  = lax.dot_general({{.*}})  # model.py:5 jit(mlp)/dot_general
// JAX-NEXT:  return

// INSPECT:      == collectives ==
// INSPECT:      needed by       at                     caused by
// INSPECT:      all_reduce {{.*}} stablehlo.tanh  model.py:4:8 (in mlp)  action 2

// PLAIN-NOT: loc(
