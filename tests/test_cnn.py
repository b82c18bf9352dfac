"""A ResNet-style CNN's training step (examples/cnn_train_step.py), and a ViT's
patch embedding with one transformer block, partitioned and checked against
`jax.jit`: data parallelism; channel parallelism ("Megatron for convs": the
first conv of each block splits its output channels, the second its input
channels, then sums); every conv splitting its output channels (conflicting
requests, resolved in the actions' order); spatial partitioning (the images'
rows, with halos).
An equinox CNN with an optax optimizer runs under data parallelism too.
"""

from __future__ import annotations

import collections

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import partir
from dialects.interpreter.spmd import run_spmd
from examples import cnn_train_step as cnn
from examples import layers
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
DATA = partir.BatchParallel("batch")
"""The data are told from the state (`momentum` too) by the program's structure."""
CHANNELS = partir.ManualPartition(
    {"*/layers/*/conv1/kernel": {3: "model"}, "*/down/conv1/kernel": {3: "model"}}
)
ROWS = partir.ManualPartition({"images": {1: "model"}})
OUT_CHANNELS = partir.ManualPartition({"*/**/kernel": {3: "model"}})
"""Every conv kernel (HWIO) and its momentum split on its output channels."""


def collective_kinds(lowered) -> collections.Counter:
    return collections.Counter((c.kind, c.axes) for c in lowered.collectives)


def local_shape(collective) -> tuple[int, ...]:
    """The shape each device sends into `collective`."""
    return tuple(collective.op.operands[0].type.get_shape())


def check_step(tactics, conflicts: bool = False):
    """The step under `tactics` equals jax.jit's; its lowered program, which
    reports conflicting requests only where the caller expects some."""
    args = cnn.make_args()
    compiled = partir.jit(cnn.program, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(*args), jax.jit(cnn.program)(*args), what="CNN step")
    lowered = compiled.lower(*args)
    assert bool(lowered.conflicts) == conflicts, lowered.conflicts
    return lowered, args


def test_data_parallel_cnn_step_sums_gradients_and_batch_statistics_only():
    """Each device runs its images; batch norm's statistics and the
    gradients are all-reduced over "batch", and nothing else moves."""
    lowered, args = check_step([DATA])
    kinds = collective_kinds(lowered)
    assert set(kinds) == {("all_reduce", ("batch",))}, kinds
    # What is summed is shaped like a parameter (its gradient, the head's
    # transposed; a batch-norm statistic is shaped like its scale) or is the
    # loss: never an activation. Each kernel's gradient is summed once.
    params = jax.tree.leaves(args[0])
    summed = [local_shape(c) for c in lowered.collectives]
    assert {tuple(sorted(s)) for s in summed} <= {tuple(sorted(p.shape)) for p in params} | {()}
    assert sorted(s for s in summed if len(s) == 4) == sorted(p.shape for p in params if p.ndim == 4)
    assert_leaves_close(
        run_spmd(lowered.module, jax.tree_util.tree_leaves(args)),
        jax.tree_util.tree_leaves(jax.jit(cnn.program)(*args)),
        what="SPMD interpreter",
    )


def test_channel_parallel_blocks_sum_once_per_block_each_way():
    """conv1 splits its output channels (its batch norm and relu follow per
    channel), conv2 contracts them: one all-reduce over "model" per block
    forward, one for the gradient of the block's input backward."""
    lowered, _ = check_step([DATA, CHANNELS])
    kinds = collective_kinds(lowered)
    blocks = len(cnn.make_args()[0]["layers"]) + 1  # and the downsampling block
    assert kinds[("all_reduce", ("model",))] == 2 * blocks, kinds
    assert set(kinds) == {("all_reduce", ("batch",)), ("all_reduce", ("model",)),
                          ("all_reduce", ("batch", "model"))}, kinds
    assert_statistics_summed_over_both_axes(lowered)


def assert_statistics_summed_over_both_axes(lowered) -> None:
    """A batch norm's mean over a second conv's output (partial over "model")
    is summed over both axes at once: one channel vector per block."""
    both = [c for c in lowered.collectives if c.axes == ("batch", "model")]
    blocks = len(cnn.make_args()[0]["layers"]) + 1
    assert len(both) == blocks and all(len(local_shape(c)) == 1 for c in both), both


def test_every_conv_splitting_its_output_channels_gathers_channels_never_images():
    """Every kernel asks for its output channels over "model", but a conv
    that reads another's channel-split output contracts those channels: it
    cannot also split its own output channels over the same axis. The earlier
    action wins (the tree's order: `down`, `layers`, then `stem`), the
    conflicts name both kernels, and the loser's value is redistributed:

    - forward, a block's first conv and the shortcut read the channel-split
      residual stream: an all_gather of its channels; a block's second conv
      contracts its first conv's split channels (Megatron's row split), so its
      kernel moves from output- to input-channel split (a kernel-sized
      all_to_all, and one back for its gradient) and its output is a partial
      sum, reduce-scattered onto its channels over "model" (what follows it,
      batch norm and the residual add, runs channel split); the head's
      logits are all-reduced over "model" (the pooled features are channel
      split);
    - backward, gradients reaching channel-split activations are partial sums
      over the split channels (reduce_scatter onto the channels), and the
      kernels' gradients gather their conv's input channels again;
    - over "batch", only the data-parallel sums (gradients, batch norm).

    No image (the batch dim) is ever gathered."""
    lowered, _ = check_step([DATA, OUT_CHANNELS], conflicts=True)
    assert {c.op for c in lowered.conflicts} <= {
        "stablehlo.convolution", "stablehlo.add", "stablehlo.subtract"}, lowered.conflicts
    assert all("['kernel']" in v for c in lowered.conflicts for v in c.values), lowered.conflicts
    kinds = collective_kinds(lowered)
    assert set(kinds) == {
        ("all_reduce", ("batch",)), ("all_reduce", ("model",)), ("all_gather", ("model",)),
        ("reduce_scatter", ("model",)), ("all_to_all", ("model",)),
    }, kinds
    by_kind = collections.defaultdict(list)
    for c in lowered.collectives:
        by_kind[c.kind].append(c)
    assert {c.op.dim.value.data for c in by_kind["all_gather"]} == {3}  # channels only
    assert {c.op.attributes["needed_by"].data for c in by_kind["all_gather"]} == {
        "stablehlo.convolution"}
    assert {c.op.dim.value.data for c in by_kind["reduce_scatter"]} == {3}
    kernels = {p.shape[:2] for p in jax.tree.leaves(cnn.make_args()[0]) if p.ndim == 4}
    assert all(local_shape(c)[:2] in kernels for c in by_kind["all_to_all"])  # kernels move
    blocks = len(cnn.make_args()[0]["layers"]) + 1
    assert kinds[("reduce_scatter", ("model",))] > blocks  # each second conv, the gradients
    assert kinds[("all_reduce", ("model",))] == 1  # the logits


def test_spatially_partitioned_cnn_step_exchanges_halos():
    """The images' rows split over "model": convolutions exchange halos, the
    2x2 pools and batch norm run on each device's rows (the statistics sum
    over rows and images), and the only gathers are for two gradients of the
    downsampling block: the strided conv's (a transposed convolution, whose
    dilated input does not split evenly with its output) and the average
    pool's (an interior `pad`)."""
    lowered, _ = check_step([DATA, ROWS])
    kinds = collective_kinds(lowered)
    assert kinds[("collective_permute", ("model",))] > 0
    gathers = [c for c in lowered.collectives if c.kind == "all_gather"]
    needed_by = sorted(c.op.attributes["needed_by"].data for c in gathers)
    assert needed_by == ["stablehlo.convolution", "stablehlo.pad"], needed_by
    assert set(kinds) <= {
        ("all_reduce", ("batch",)), ("all_reduce", ("batch", "model")),
        ("all_reduce", ("model",)), ("collective_permute", ("model",)),
        ("all_gather", ("model",)),
    }, kinds


# --------------------------------------------------------------------------
# A ViT: patch embedding (a conv whose window is its stride) and one block


def vit_loss(params, images, targets):
    patches = lax.conv_general_dilated(
        images, params["embed"], (4, 4), "VALID", dimension_numbers=cnn.NHWC
    )
    batch, rows, cols, width = patches.shape
    tokens = patches.reshape(batch, rows * cols, width) + params["position"]
    out = layers.block(params["block"], tokens, heads=2)
    return jnp.mean(jnp.square(jnp.mean(out, axis=1) @ params["head"] - targets))


def vit_args(batch=8, size=16, width=32):
    rng = np.random.default_rng(0)
    params = {
        "embed": layers.normal(rng, 4, 4, 3, width, scale=0.1),
        "position": layers.normal(rng, (size // 4) ** 2, width, scale=0.02),
        "block": layers.init_block(rng, width, 2 * width),
        "head": layers.normal(rng, width, 4),
    }
    return params, layers.normal(rng, batch, size, size, 3, scale=1.0), layers.normal(rng, batch, 4)


@pytest.mark.parametrize("tactics", [
    [partir.BatchParallel("batch")],
    [partir.BatchParallel("batch"), partir.Megatron("model")],
], ids=["dp", "dp+megatron"])
def test_a_vit_patch_embedding_and_block_train_on_shards(tactics):
    """(The update, not the bare gradients, is compared: the attention's key
    bias has a gradient of exactly zero, which leaves only rounding noise.)"""
    args = vit_args()

    def step(params, images, targets):
        value, grads = jax.value_and_grad(vit_loss)(params, images, targets)
        return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    compiled = partir.jit(step, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(*args), jax.jit(step)(*args), what="ViT step")
    lowered = compiled.lower(*args)
    assert lowered.conflicts == []
    kinds = collective_kinds(lowered)
    assert ("all_gather", ("batch",)) not in kinds  # the patches stay split by image


# --------------------------------------------------------------------------
# equinox layers, an optax optimizer


class SmallCnn(eqx.Module):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(3, 8, 3, padding=1, key=k1)
        self.conv2 = eqx.nn.Conv2d(8, 8, 3, padding=1, key=k2)
        self.pool = eqx.nn.MaxPool2d(2, 2)
        self.head = eqx.nn.Linear(8, 4, key=k3)

    def __call__(self, image):  # one CHW image: equinox layers are vmapped
        h = self.pool(jax.nn.relu(self.conv1(image)))
        h = jax.nn.relu(self.conv2(h))
        return self.head(jnp.mean(h, axis=(1, 2)))


def test_an_equinox_cnn_with_an_optax_optimizer_trains_on_shards():
    model = SmallCnn(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    optimizer = optax.adamw(1e-2)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(1)
    images = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 16)

    def step(params, opt_state, images, labels):
        def loss(params):
            logits = jax.vmap(eqx.combine(params, static))(images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    args = (params, opt_state, images, labels)
    compiled = partir.jit(step, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    assert_leaves_close(compiled(*args), jax.jit(step)(*args), what="equinox CNN step")
    kinds = collective_kinds(compiled.lower(*args))
    assert set(kinds) == {("all_reduce", ("batch",))}, kinds
