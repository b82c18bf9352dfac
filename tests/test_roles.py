"""BatchParallel's default data, told from the state by the program's
structure (`partir.roles`), whatever the arguments are called."""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.dialects.builtin import TensorType, f32

import partir
from examples import block_forward, block_train_step, cnn_train_step, scanned_stack
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
DATA_PARALLEL = [partir.BatchParallel("batch")]


def kinds(lowered) -> collections.Counter:
    return collections.Counter((c.kind, c.axes) for c in lowered.collectives)


def mlp(p, x):
    return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]


def step(p, m, x, labels):
    """A step whose state is called `p` and `m` (no name partir knows)."""
    loss, g = jax.value_and_grad(lambda p: jnp.mean((mlp(p, x) - labels) ** 2))(p)
    m = jax.tree.map(lambda m, g: 0.9 * m + g, m, g)
    return loss, jax.tree.map(lambda p, m: p - 0.1 * m, p, m), m


def step_args(batch=16, width=8, hidden=16):
    rng = np.random.default_rng(0)
    p = {"w1": rng.standard_normal((width, hidden)).astype(np.float32),
         "b1": rng.standard_normal(hidden).astype(np.float32),
         "w2": rng.standard_normal((hidden, width)).astype(np.float32)}
    m = jax.tree.map(lambda a: (0.1 * a).astype(np.float32), p)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    return p, m, x, rng.standard_normal((batch, width)).astype(np.float32)


def test_state_returned_updated_is_not_data_whatever_its_name():
    """`p` and `m` come back updated, so only `x` and `labels` are split:
    the step's collectives are the gradients' all-reduces over "batch"."""
    args = step_args()
    compiled = partir.jit(step, mesh=MESH, tactics=DATA_PARALLEL)
    assert_leaves_close(compiled(*args), jax.jit(step)(*args), what="step")
    lowered = compiled.lower(*args)
    assert set(kinds(lowered)) == {("all_reduce", ("batch",))}, kinds(lowered)
    split = [spec[0] for spec in lowered.compile().program.IN_SPECS]
    assert split == [None] * 6 + ["batch", "batch"]  # p (3 leaves), m (3), x, labels


def test_a_lone_parameter_array_returned_as_its_own_result_is_state():
    def lone(w, x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return loss, w - 0.1 * g

    p, _, x, y = step_args(width=8, hidden=8)
    w = p["w1"]  # 8 x 8: its leading dim differs from the batch's 16
    compiled = partir.jit(lone, mesh=MESH, tactics=DATA_PARALLEL)
    assert_leaves_close(compiled(w, x, y), jax.jit(lone)(w, x, y), what="lone step")
    assert set(kinds(compiled.lower(w, x, y))) == {("all_reduce", ("batch",))}


def test_the_cnn_step_with_momentum_needs_no_inputs():
    """examples/cnn_train_step.py calls its optimizer state `momentum`."""
    args = cnn_train_step.make_args()
    compiled = partir.jit(cnn_train_step.program, mesh=MESH, tactics=DATA_PARALLEL)
    lowered = compiled.lower(*args)
    assert set(kinds(lowered)) == {("all_reduce", ("batch",))}, kinds(lowered)


def test_a_program_that_does_not_say_gets_the_candidates_and_the_inputs_to_write():
    """A forward function over stacked `blocks` (not returned, not named as
    state): its arguments' leading dims differ, so it cannot tell."""
    blocks, x = scanned_stack.mlp_args()
    compiled = partir.jit(scanned_stack.mlp_program, mesh=MESH, tactics=DATA_PARALLEL)
    with pytest.raises(partir.TacticError) as info:
        compiled.lower(blocks, x)
    message = str(info.value)
    assert message.startswith("BatchParallel: cannot tell the data from the state")
    assert "inputs=['x']" in message and "blocks/" in message


def renamed_block_step(p, s, inputs, targets):
    """The block training step with its state called `p` and `s`."""
    return block_train_step.program(p, s, inputs, targets)


def test_megatron_and_zero_find_the_parameters_and_optimizer_state_by_structure():
    """`p` is mirrored in `s` (Adam's m and v): the conventions apply under
    `p`, and ZeRO shards `s` (stage 1) and `p` (stage 3), as with the names
    `params` and `opt_state`."""
    args = block_train_step.make_args()
    for tactics in ([partir.BatchParallel("batch"), partir.Megatron("model")],
                    [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)]):
        renamed = partir.jit(renamed_block_step, mesh=MESH, tactics=tactics).lower(*args)
        named = partir.jit(block_train_step.program, mesh=MESH, tactics=tactics).lower(*args)
        assert kinds(renamed) == kinds(named)
        assert [c.bytes_per_device for c in renamed.collectives] == [
            c.bytes_per_device for c in named.collectives
        ]
    compiled = partir.jit(renamed_block_step, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(*args), jax.jit(renamed_block_step)(*args), what="ZeRO-3")


def test_megatron_conventions_reach_any_root_in_a_forward_function():
    """A forward function whose parameters are called `weights` (not returned:
    nothing says they are state): the conventions match under any root."""
    params, x = block_forward.make_args()

    def forward(weights, x):
        return block_forward.program(weights, x)

    tactics = [partir.BatchParallel("batch", inputs="x"), partir.Megatron("model")]
    renamed = partir.jit(forward, mesh=MESH, tactics=tactics)
    assert_leaves_close(renamed(params, x), jax.jit(forward)(params, x), what="forward")
    named = partir.jit(block_forward.program, mesh=MESH, tactics=tactics)
    assert kinds(renamed.lower(params, x)) == kinds(named.lower(params, x))


def test_the_optimizer_state_beside_the_parameters_in_one_argument():
    """One state argument holding the model (its weights and a counter, as
    NNX's dropout keeps one) and the optimizer (a step and copies `mu`, `nu`
    of the weights only): the model's entry is the parameters, the
    optimizer's the optimizer state, and the counter is trained by neither;
    the layers of the model, alike in shape, do not mirror each other."""
    from partir.importer import entry_function
    from partir.plan import ProgramView
    from partir.roles import Roles

    rng = np.random.default_rng(3)
    layers = [{"w": rng.standard_normal((8, 8)).astype(np.float32),
               "b": np.zeros(8, np.float32)} for _ in range(2)]
    model = {"layers": layers, "count": np.zeros((), np.uint32)}
    weights = {"layers": layers}
    optimizer = {"step": np.zeros((), np.int32),
                 "moments": {"mu": jax.tree.map(np.zeros_like, weights),
                             "nu": jax.tree.map(np.zeros_like, weights)}}

    def step(state, x):
        model, optimizer = state

        def loss(weights):
            h = x
            for layer in weights["layers"]:
                h = jnp.tanh(h @ layer["w"] + layer["b"])
            return jnp.mean(h ** 2)

        grads = jax.grad(loss)({"layers": model["layers"]})
        mu = jax.tree.map(lambda m, g: 0.9 * m + g, optimizer["moments"]["mu"], grads)
        nu = jax.tree.map(lambda v, g: 0.9 * v + g * g, optimizer["moments"]["nu"], grads)
        new = jax.tree.map(lambda p, m: p - 0.1 * m, {"layers": model["layers"]}, mu)
        return ({"layers": new["layers"], "count": model["count"] + 1},
                {"step": optimizer["step"] + 1, "moments": {"mu": mu, "nu": nu}})

    x = rng.standard_normal((16, 8)).astype(np.float32)
    module = partir.import_jax(step, (model, optimizer), x)
    view = ProgramView.of(entry_function(module))
    roles = Roles.of(view.arguments, view.results)
    assert roles.parameters == ("state/0",) and roles.optimizer == ("state/1",)
    assert roles.untrained == {"state/0/count"}
    assert roles.why_optimizer("state/1") == "under state/1, which mirrors the parameters state/0"
    tactics = [partir.BatchParallel("batch"), partir.ZeRO("batch", stage=1)]
    compiled = partir.jit(step, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled((model, optimizer), x), jax.jit(step)((model, optimizer), x),
                        what="one-argument step")
    split = {s.leaf for s in compiled.lower((model, optimizer), x).report().selections
             if s.tactic == "ZeRO-1(batch)" and s.dim is not None}
    assert len(split) == 8 and all("['moments']" in leaf for leaf in split)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    name: str
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.type.get_shape())


def test_unnamed_leaves_are_told_apart_in_linear_work(monkeypatch):
    """IR that names no argument: every array a lone `args/i` of one of two
    shapes, each returned as `result/i`. Each is matched to its result, the
    first of each shape is parameters and the others its copies, and the
    work (nodes checked against the claimed or taken ones, copies
    examined) grows with the arrays, not with their pairs."""
    from partir import roles

    counts = collections.Counter()
    overlaps, apart = roles._Nodes.overlaps, roles._apart

    def counted_overlaps(self, node):
        counts["overlaps"] += 1
        return overlaps(self, node)

    def counted_apart(node, copy, state):
        counts["apart"] += 1
        return apart(node, copy, state)

    monkeypatch.setattr(roles._Nodes, "overlaps", counted_overlaps)
    monkeypatch.setattr(roles, "_apart", counted_apart)
    found = {}
    for n in (40, 160):
        types = [TensorType(f32, [3, 2] if i % 2 else [5]) for i in range(n)]
        counts.clear()
        found[n] = roles.Roles.of(
            [_Leaf(f"args[{i}]", t) for i, t in enumerate(types)],
            [_Leaf(f"result[{i}]", t) for i, t in enumerate(types)],
        )
        assert found[n].returned == {f"args/{i}": f"result/{i}" for i in range(n)}
        assert found[n].parameters == ("args/0", "args/1")
        copies = [*range(2, n, 2), *range(3, n, 2)]  # args/0's, then args/1's
        assert found[n].optimizer == tuple(f"args/{i}" for i in copies)
        assert found[n].mirrors == {f"args/{i}": f"args/{i % 2}" for i in range(2, n)}
        assert counts["overlaps"] <= 6 * n and counts["apart"] <= 2 * n, (n, counts)
