"""The study's plain MNIST autoencoder: train with optax Adam, report test reconstruction loss."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax.training import train_state

from hwrepro import data
from hwrepro.data import mnist
from hwrepro.errors import ConfigError
from hwrepro.harness import numerics, parallel, trained
from hwrepro.harness.loop import fit, snapshot_spacing, snapshotter
from hwrepro.harness.records import Run
from hwrepro.models import reconstruction_loss
from hwrepro.models.model_registry import model_class


def validate(config: ml_collections.ConfigDict) -> None:
    parallel.require_one_device(config, "autoencoder")
    sources = data.get(config.data.dataset, "images").sources
    model_class(config.model.name, _model_fields(config))
    sizes = list(config.model.get("encoder_sizes") or ())
    if "encoder_sizes" in config.model and (not sizes or any(not isinstance(n, int) or n <= 0 for n in sizes)):
        raise ConfigError(f"model.encoder_sizes={sizes} must be a non-empty list of positive integers")
    if config.data.source not in sources:
        raise ConfigError(f"data.source={config.data.source!r} is not one of {', '.join(sources)} for "
                          f"data.dataset={config.data.dataset!r}")


def make_model(config: ml_collections.ConfigDict):
    """The model named by config.model.name, built from the other config.model fields (lists as tuples, so
    the module stays hashable), with activations in numerics.precision and parameters in numerics.param_dtype."""
    fields = _model_fields(config)
    return model_class(config.model.name, fields)(**fields)


def _model_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in config.model.items() if k != "name"}
    return dict(fields, dtype=numerics.jnp_dtype(config.numerics.precision),
                param_dtype=numerics.jnp_dtype(config.numerics.param_dtype))


def create_state(config: ml_collections.ConfigDict, key: jax.Array) -> train_state.TrainState:
    model = make_model(config)
    params = model.init(key, jnp.zeros((1, 784), jnp.float32))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params,
                                         tx=optax.adam(config.train.learning_rate))


def loss_fn(params: Any, x: jax.Array, apply_fn) -> jax.Array:
    return reconstruction_loss(apply_fn({"params": params}, x), x)


@jax.jit
def _eval_loss(state: train_state.TrainState, images: jax.Array) -> jax.Array:
    return loss_fn(state.params, images, state.apply_fn)


def _train_step(state: train_state.TrainState, x: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, x, state.apply_fn)
    return state.apply_gradients(grads=grads), {"loss": loss}


train_step = jax.jit(_train_step, donate_argnums=0)


def make_predict(config: ml_collections.ConfigDict, params: Any):
    """A trained model's prediction (hwrepro.load): images float [B, 784] in [0, 1] -> reconstructions float32
    [B, 784] in (0, 1) (the sigmoid of the decoder's logits), as NumPy."""
    model = make_model(config)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    reconstruct = jax.jit(lambda x: jax.nn.sigmoid(model.apply({"params": params}, x).astype(jnp.float32)))
    return lambda images: np.asarray(reconstruct(jnp.asarray(images, jnp.float32).reshape(len(images), -1)))


def run(config: ml_collections.ConfigDict, rec: Run):
    splits = data.load(config, "images")
    rec.note_data(splits.source, num_train=len(splits.train_images), num_test=len(splits.test_images))
    steps_per_epoch = len(splits.train_images) // config.train.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"train.batch_size={config.train.batch_size} exceeds the {len(splits.train_images)} "
                          f"training images of {splits.source}")
    num_steps = config.train.num_steps or config.train.num_epochs * steps_per_epoch
    init_key, order_seed = jax.random.split(jax.random.key(config.seed))
    state = create_state(config, init_key)
    state = state.replace(params=trained.start_from(config, state.params, rec))
    test_x = jnp.asarray(splits.test_images.reshape(len(splits.test_images), -1), jnp.float32) / 255.0
    batches = mnist.batches(splits.train_images, config.train.batch_size,
                            seed=int(jax.random.randint(order_seed, (), 0, 2**31 - 1)))
    probe_images = splits.train_images[:512]  # the Hessian's fixed probe batch
    probe = jnp.asarray(probe_images.reshape(len(probe_images), -1), jnp.float32) / 255.0
    at_snapshot = snapshotter(rec, lambda s: s.params, loss_fn=functools.partial(loss_fn, apply_fn=state.apply_fn),
                                 probe_batch=probe, hessian_iters=config.train.hessian_iters,
                                 key=jax.random.key(config.data.seed))
    state = fit(state, train_step, batches, num_steps=num_steps, examples_per_step=config.train.batch_size,
                rec=rec, log_every=config.train.log_every, steps_per_epoch=steps_per_epoch,
                eval_fn=lambda s: {"loss": _eval_loss(s, test_x)}, eval_every=config.train.eval_every,
                snapshot_every=snapshot_spacing(num_steps, config.train.checkpoints),
                snapshot_fn=at_snapshot, checkpoint_every=config.train.checkpoint_every,
                checkpoint_keep=config.train.checkpoint_keep)
    test_loss = float(_eval_loss(state, test_x))
    rec.print(f"test reconstruction loss (binary cross-entropy per pixel): {test_loss:.6f}")
    return {"test_loss": test_loss, "steps": num_steps, "epochs": num_steps / steps_per_epoch}, state.params
