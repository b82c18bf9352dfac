// RUN: sh -c 'partir-opt %s; echo "exit status $?"' 2>&1 | filecheck %s

// Every error exits with status exactly 1 (lit's `not`, used by the other
// tests here, accepts any non-zero status, a crash included).

partir.mesh @mesh ["x" = 4, "x" = 2]

// CHECK-NOT:  Traceback
// CHECK:      error: mesh @mesh repeats an axis name: ['x', 'x']; in: "partir.mesh"() <{sym_name = "mesh", axis_names = ["x", "x"], axis_sizes = array<i64: 4, 2>}> : () -> ()
// CHECK-NEXT: exit status 1
