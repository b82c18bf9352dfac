// RUN: not partir-opt %s -p 'partir-declare-mesh{axes="x=4"},partir-megatorn' 2>&1 | filecheck %s

// A misspelt pass name lists partir's passes (xDSL's own are in --help).

func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  func.return %x : tensor<8xf32>
}

// CHECK-NOT:  Traceback
// CHECK:      error: Unrecognized passes: ['partir-megatorn']; partir's passes: partir-declare-mesh, inline-calls, partir-tile, partir-batch-parallel, partir-megatron, partir-expert-parallel, partir-zero, partir-manual-partition, partir-auto, partir-annotations, partir-propagate, partir-pipeline, partir-lower-spmd, partir-schedule-pipeline, partir-emit-jax (partir-opt --help lists all)
// CHECK-NOT:  Traceback
