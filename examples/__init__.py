"""Example programs: each module has `program` (a JAX function) and `make_args()`.

Tests and benchmarks import them by name; `ALL` lists the foundation set.
"""

ALL = (
    "mlp_forward",
    "mlp_train_step",
    "block_forward",
    "block_train_step",
    "cross_entropy",
    "transformer_stack",
)
