// RUN: partir-opt %s | partir-opt | filecheck %s --check-prefix=ROUND
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"}' | filecheck %s
// RUN: partir-opt %s -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-annotations,partir-lower-spmd,partir-emit-jax' --check-numerics | filecheck %s --check-prefix=JAX

// The text jax.jit(fn).lower(x).as_text() prints for a nested shard_map
// whose kernel calls pmax and all_to_all over "model" and axis_index("batch")
// (StableHLO's collectives in generic form, with JAX's channel handles and
// device-id replica groups). It parses and prints back; declaring partir's
// mesh reads each collective as partir's spmd op over the mesh axes its
// groups span (pmax: an all-reduce of kind max; partition_id / 2 % 4: the
// device's index along "batch"); the emitted shard_map program calls the
// jax.lax collectives, and --check-numerics runs the text as written on the
// reference interpreter (every device at once) against each pass.

sdy.mesh @mesh = <["batch"=4, "model"=2]> {stablehlo.mesh = {axes = [{name = "batch", size = 4 : i64}, {name = "model", size = 2 : i64}]}}
func.func public @main(%arg0: tensor<16x8xf32>) -> (tensor<8x16xf32> {jax.result_info = "result"}) {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"batch"}, {"model"}]>] out_shardings=[<@mesh, [{"batch"}, {"model"}]>] manual_axes={"batch", "model"} (%arg1: tensor<4x4xf32>) {
    %1 = "stablehlo.all_reduce"(%arg1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %10 = stablehlo.maximum %arg2, %arg3 : tensor<f32>
      stablehlo.return %10 : tensor<f32>
    }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %2 = "stablehlo.all_to_all"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 1 : i64, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, split_count = 2 : i64, split_dimension = 0 : i64}> : (tensor<4x4xf32>) -> tensor<2x8xf32>
    %c = stablehlo.constant dense<2> : tensor<ui32>
    %c_0 = stablehlo.constant dense<4> : tensor<ui32>
    %3 = stablehlo.partition_id : tensor<ui32>
    %4 = stablehlo.divide %3, %c : tensor<ui32>
    %5 = stablehlo.remainder %4, %c_0 : tensor<ui32>
    %6 = stablehlo.convert %5 : (tensor<ui32>) -> tensor<i32>
    %7 = stablehlo.convert %6 : (tensor<i32>) -> tensor<f32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
    %9 = stablehlo.multiply %2, %8 : tensor<2x8xf32>
    sdy.return %9 : tensor<2x8xf32>
  } : (tensor<16x8xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// ROUND:      "stablehlo.all_reduce"(%{{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<{{\[\[}}0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, use_global_device_ids}> ({
// ROUND:        stablehlo.maximum
// ROUND:      "stablehlo.all_to_all"(%{{.*}}) <{{{.*}}split_count = 2 : i64, split_dimension = 0 : i64}>
// ROUND:      stablehlo.partition_id : tensor<ui32>

// CHECK:      spmd.all_reduce %{{.*}} over ["model"] reduction "max" : tensor<4x4xf32> -> tensor<4x4xf32>
// CHECK-NEXT: spmd.all_to_all %{{.*}} split 0 concat 1 over ["model"] : tensor<4x4xf32> -> tensor<2x8xf32>
// CHECK:      spmd.axis_index over ["batch"] : tensor<ui32>
// CHECK-NOT:  stablehlo.partition_id

// JAX:      lax.pmax(a0, ('model',))
// JAX-NEXT: lax.all_to_all({{.*}}, 'model', 0, 1, tiled=True)
// JAX:      lax.axis_index(('batch',)).astype(jnp.uint32)
