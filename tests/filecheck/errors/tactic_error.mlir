// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="data=4","model=2"},partir-batch-parallel{axis=batch}' 2>&1 | filecheck %s
// RUN: not partir-opt %s -p 'partir-megatron{axis=model}' 2>&1 | filecheck %s --check-prefix=NO-MESH

// A tactic that cannot be planned fails before it rewrites anything, with a
// message that says what to change: a mesh axis the mesh does not have
// (CHECK), or no mesh at all (NO-MESH).

func.func @main(%x: tensor<8x4xf32> {partir.name = "x"}) -> tensor<8x4xf32> {
  func.return %x : tensor<8x4xf32>
}

// CHECK-NOT:  Traceback
// CHECK:      error: BatchParallel: unknown mesh axis "batch"; the mesh has "data", "model"
// CHECK-NOT:  Traceback

// NO-MESH-NOT: Traceback
// NO-MESH:     error: Megatron: the module declares no mesh; add `partir.mesh @mesh ["batch" = 4]` or run partir-declare-mesh{axes="batch=4"} first
// NO-MESH-NOT: Traceback
