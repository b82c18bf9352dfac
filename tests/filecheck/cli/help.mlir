// RUN: partir-opt --help | filecheck %s

// `partir-opt --help` is xdsl-opt's help, its own flags, and then partir's
// passes with their options (and defaults) and what each does.

// CHECK:      usage:
// CHECK:      --print-ir-after-all
// CHECK:      --check-numerics
// CHECK:      --traceback
// CHECK:      partir passes (options with defaults; any xdsl-opt pass also works):
// CHECK-NEXT:   partir-declare-mesh{axes=}
// CHECK:        inline-calls
// CHECK:        partir-tile{value=0 dim=0 axis=}
// CHECK:        partir-batch-parallel{axis=batch inputs=none}
// CHECK:        partir-megatron{axis=model column=none column-bias=none row=none}
// CHECK:        partir-zero{axis=batch stage=3}
// CHECK:        partir-manual-partition{spec=}
// CHECK-NEXT:       Tile named values: spec="x:0=batch;params/w1:1=model"
// CHECK:        partir-propagate
// CHECK:        partir-lower-spmd
// CHECK:        partir-emit-jax
