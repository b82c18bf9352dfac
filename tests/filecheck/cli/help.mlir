// RUN: partir-opt --help | filecheck %s

// `partir-opt --help` is xdsl-opt's help, its own flags, and then partir's
// passes with their options (and defaults) and what each does.

// CHECK:      usage:
// CHECK:      --print-ir-after-all
// CHECK:      --check-numerics
// CHECK:      --traceback
// CHECK:      partir passes (options with defaults; any xdsl-opt pass also works):
// CHECK-NEXT:   partir-declare-mesh{axes=required}
// CHECK:        inline-calls
// CHECK:        partir-tile{value=0 dim=0 axis=}
// CHECK:        partir-batch-parallel{axis=required inputs=none dim=0}
// CHECK:        partir-megatron{axis=required column=none column-bias=none row=none}
// CHECK:        partir-zero{axis=required stage=3 params=none opt-state=none updates=none}
// CHECK:        partir-manual-partition{spec=required}
// CHECK-NEXT:       Tile exactly what you name, selector:dim=axis
// CHECK:        partir-auto{axes=none time-budget-s=60.0 memory-limit-bytes=none profile=none seed=0 top-k=5 progress=True}
// CHECK-NEXT:       Search the rest of the schedule: partitioning actions on `axes`,
// CHECK:        partir-propagate
// CHECK:        partir-lower-spmd
// CHECK:        partir-emit-jax{program=partir_program}
