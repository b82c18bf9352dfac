// RUN: partir-opt %examples/block_forward.mlir -p 'partir-declare-mesh{axes="batch=4","model=2"},partir-megatron{axis=model}' -o %t
// RUN: filecheck %s --input-file %t --check-prefix=FUSED
// RUN: filecheck %s --input-file %t --check-prefix=LOOPS

// partir-megatron on the transformer block's forward pass
// (examples/block_forward.py): q/k/v and the MLP's input weight are tiled on
// their output dim, the attention-out and MLP-out weights on their input dim.
// Propagation turns each half of the block into a sum loop over "model" that
// ends at the row-split matmul: two sum loops, one per all-reduce.

// FUSED-LABEL:   func.func public @main
// FUSED:         partir.loop "model" [#partir.sum]
// FUSED:           partir.slice 1 %params_attn_wk
// FUSED:           partir.slice 1 %params_attn_wq
// FUSED:           partir.slice 1 %params_attn_wv
// FUSED:           partir.slice 0 %params_attn_wo
// FUSED-NEXT:      stablehlo.dot_general
// FUSED-NEXT:      partir.yield
// FUSED-NEXT:    } {origin = #partir.origin<1, "Megatron", "params['attn']['bk']">} : tensor<4x8x32xf32>
// FUSED:         partir.loop "model" [#partir.sum]
// FUSED:           partir.slice 1 %params_mlp_w_in
// FUSED:           partir.slice 0 %params_mlp_w_out
// FUSED-NEXT:      stablehlo.dot_general
// FUSED-NEXT:      partir.yield
// FUSED-NEXT:    } {origin = #partir.origin<8, "Megatron", "params['mlp']['b_in']">} : tensor<4x8x32xf32>
// FUSED:         func.return

// ... and those two are the only loops.
// LOOPS-COUNT-2: partir.loop
// LOOPS-NOT:     partir.loop
