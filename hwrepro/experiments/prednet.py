"""PredNet next-frame prediction (Lotter et al. 2016; the CPU-versus-GPU study's predictive network).

Trains on the weighted error units (output_mode='error', layer weights L_0 or L_all, first time step
weighted 0) with Adam, the learning rate dropping 10x halfway as in the reference kitti_train.py, then
evaluates on held-out test clips: next-frame MSE and SSIM of the model's predictions against the
copy-last-frame baseline, frames 1..nt-1 (frame 0 is predicted from a zero state, so the reference ignores
it). A PNG strip of true versus predicted frames goes to the run folder. The frames come from
config.data.dataset, a data set of kind "video" (hwrepro/data: "video" for files, frames, arrays or the
synthetic stand-in; "moving_mnist").
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax.training import train_state

from hwrepro import data
from hwrepro.harness import numerics, parallel, trained
from hwrepro.data import video
from hwrepro.errors import ConfigError
from hwrepro.models.model_registry import model_class
from hwrepro.models.predictive_coding import (PredNet, layer_loss_weights, param_count, time_loss_weights,
                                    weighted_error_loss)
from hwrepro.harness.records import Run
from hwrepro.harness.loop import fit, snapshot_spacing, snapshotter


def validate(config: ml_collections.ConfigDict) -> None:
    parallel.require_one_device(config, "PredNet")
    m, d = config.model, config.data
    data.get(d.dataset, "video")  # each data set checks its own data.source when it loads
    model_class(m.name, _model_fields(config))
    layers = len(m.stack_sizes)
    for name, want in (("R_stack_sizes", layers), ("A_filt_sizes", layers - 1),
                       ("Ahat_filt_sizes", layers), ("R_filt_sizes", layers)):
        if len(m[name]) != want:
            raise ConfigError(f"model.{name} has {len(m[name])} entries, expected {want} "
                              f"for {layers} layers (model.stack_sizes)")
    if m.stack_sizes[0] != d.channels:
        raise ConfigError(f"model.stack_sizes[0]={m.stack_sizes[0]} must equal data.channels={d.channels}")
    factor = 2 ** (layers - 1)
    if any(s % factor for s in d.image_size):
        raise ConfigError(f"data.image_size={tuple(d.image_size)} must be divisible by {factor} for {layers} layers")
    if m.layer_loss_weights not in ("L_0", "L_all"):
        raise ConfigError(f"model.layer_loss_weights={m.layer_loss_weights!r} is not 'L_0' or 'L_all'")
    if d.nt < 2:
        raise ConfigError(f"data.nt={d.nt} must be at least 2")
    if not 0 <= config.eval.extrap_start_time < d.nt:
        raise ConfigError(f"eval.extrap_start_time={config.eval.extrap_start_time} must be in [0, data.nt)")


def make_model(config: ml_collections.ConfigDict, output_mode: str = "error",
               extrap_start_time: int | None = None, unroll: int | None = None) -> PredNet:
    """The config's PredNet with activations in numerics.precision and parameters in numerics.param_dtype
    (unroll: see PredNet; None unrolls the whole clip, what training on a CPU wants)."""
    fields = _model_fields(config, output_mode, extrap_start_time, unroll)
    return model_class(config.model.name, fields)(**fields)


def _model_fields(config: ml_collections.ConfigDict, output_mode: str = "error",
                  extrap_start_time: int | None = None, unroll: int | None = None) -> dict[str, Any]:
    m = config.model
    return dict(stack_sizes=tuple(m.stack_sizes), R_stack_sizes=tuple(m.R_stack_sizes),
                A_filt_sizes=tuple(m.A_filt_sizes), Ahat_filt_sizes=tuple(m.Ahat_filt_sizes),
                R_filt_sizes=tuple(m.R_filt_sizes), pixel_max=float(m.pixel_max), output_mode=output_mode,
                extrap_start_time=extrap_start_time, unroll=unroll,
                dtype=numerics.jnp_dtype(config.numerics.precision),
                param_dtype=numerics.jnp_dtype(config.numerics.param_dtype))


def learning_rate_schedule(config: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
    """learning_rate until lr_drop_fraction of the steps, then times lr_drop_factor (reference: 1e-3 -> 1e-4
    at epoch 75 of 150)."""
    t = config.train
    return optax.piecewise_constant_schedule(t.learning_rate,
                                             {int(num_steps * t.lr_drop_fraction): t.lr_drop_factor})


@functools.partial(jax.jit, static_argnames=("model", "height", "width", "channels"))
def init_params(model: PredNet, key: jax.Array, height: int, width: int, channels: int) -> Any:
    """model's parameters for [height, width, channels] frames.

    Jitted, on one frame, through the rolled-up loop: the same parameters as a plain `model.init`, but a
    few seconds of compiling instead of tens (eager init compiles op by op, and an unrolled scan repeats
    the step's body once per frame).
    """
    frames = jnp.zeros((1, 1, height, width, channels), jnp.float32)
    return model.clone(unroll=1).init(key, frames)["params"]


def create_state(config: ml_collections.ConfigDict, key: jax.Array, num_steps: int) -> train_state.TrainState:
    """Parameters from `key` and Adam (Keras defaults beta1 0.9, beta2 0.999) with the step schedule."""
    model = make_model(config)
    height, width = config.data.image_size
    params = init_params(model, key, height, width, config.data.channels)
    tx = optax.adam(learning_rate_schedule(config, num_steps), eps=config.train.adam_eps)
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def loss_fn(params: Any, frames: jax.Array, apply_fn: Callable, layer_weights: jax.Array,
            time_weights: jax.Array) -> jax.Array:
    """The reference training loss: error units weighted by layer and time step, batch mean."""
    return weighted_error_loss(apply_fn({"params": params}, frames), layer_weights, time_weights)


def _train_step(state: train_state.TrainState, frames: jax.Array, layer_weights: jax.Array,
                time_weights: jax.Array) -> tuple[train_state.TrainState, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(state.params, frames, state.apply_fn, layer_weights, time_weights)
    return state.apply_gradients(grads=grads), {"loss": loss}


train_step = jax.jit(_train_step, donate_argnums=0)


def _gaussian_window(size: int, sigma: float) -> jax.Array:
    x = jnp.arange(size, dtype=jnp.float32) - (size - 1) / 2
    g = jnp.exp(-x ** 2 / (2 * sigma ** 2))
    return g / g.sum()


def ssim(x: jax.Array, y: jax.Array, max_val: float = 1.0, size: int = 11, sigma: float = 1.5) -> jax.Array:
    """Mean SSIM (Wang et al. 2004) of image batches [..., H, W, C] -> [...].

    Gaussian window size x size, std sigma, applied 'valid' (as the original MATLAB ssim_index) to each
    channel; constants C1 = (0.01 max_val)^2, C2 = (0.03 max_val)^2; the SSIM map is averaged over space and
    channels. Needs H, W >= size.
    """
    batch_shape, (height, width, channels) = x.shape[:-3], x.shape[-3:]
    g = _gaussian_window(size, sigma)
    kernel = jnp.tile(jnp.outer(g, g)[:, :, None, None], (1, 1, 1, channels))  # HWIO, depthwise

    def blur(z: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(z, kernel, (1, 1), "VALID", feature_group_count=channels,
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            precision=jax.lax.Precision.HIGHEST)

    x = x.reshape(-1, height, width, channels).astype(jnp.float32)
    y = y.reshape(-1, height, width, channels).astype(jnp.float32)
    c1, c2 = (0.01 * max_val) ** 2, (0.03 * max_val) ** 2
    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x ** 2
    var_y = blur(y * y) - mu_y ** 2
    cov = blur(x * y) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) * (var_x + var_y + c2))
    return ssim_map.mean(axis=(1, 2, 3)).reshape(batch_shape)


@functools.partial(jax.jit, static_argnames=("model",))
def clip_metrics(params: Any, frames: jax.Array, model: PredNet, layer_weights: jax.Array,
                 time_weights: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    """Per-clip evaluation of frames [B, T, H, W, C] with `model` (output_mode 'all').

    Returns ({name: [B]}, predictions [B, T, H, W, C]). MSE and SSIM cover frames 1..T-1 only (frame 0 is
    predicted from the zero state); the baseline predicts frame t by frame t-1. With model.extrap_start_time
    set, 'extrap' metrics cover frames extrap_start_time..T-1 and their baseline holds the last frame seen.
    """
    out = model.apply({"params": params}, frames)
    pred = out.prediction.astype(jnp.float32)
    true, prev = frames[:, 1:], frames[:, :-1]
    metrics = {
        "loss": jnp.einsum("btl,l,t->b", out.errors, layer_weights, time_weights),
        "mse": jnp.mean((pred[:, 1:] - true) ** 2, axis=(1, 2, 3, 4)),
        "mse_copy_last": jnp.mean((prev - true) ** 2, axis=(1, 2, 3, 4)),
        "ssim": jnp.mean(ssim(pred[:, 1:], true), axis=1),
        "ssim_copy_last": jnp.mean(ssim(prev, true), axis=1),
    }
    start = model.extrap_start_time
    if start is not None:
        held = frames[:, start - 1:start]
        metrics["extrap_mse"] = jnp.mean((pred[:, start:] - frames[:, start:]) ** 2, axis=(1, 2, 3, 4))
        metrics["extrap_mse_copy_last_seen"] = jnp.mean((held - frames[:, start:]) ** 2, axis=(1, 2, 3, 4))
    return metrics, pred


def evaluate(params: Any, model: PredNet, frames: video.VideoFrames, starts: np.ndarray, nt: int,
             batch_size: int, layer_weights: jax.Array, time_weights: jax.Array
             ) -> tuple[dict[str, float], np.ndarray]:
    """Mean `clip_metrics` over the clips at `starts`, in fixed-size chunks (the last one padded by repeating
    its first clip, padding excluded from the means). Returns (metrics, predictions of the first chunk)."""
    sums: dict[str, float] = {}
    first_predictions = None
    for i in range(0, len(starts), batch_size):
        chunk = starts[i:i + batch_size]
        padded = np.concatenate([chunk, np.full(batch_size - len(chunk), chunk[0])])
        per_clip, pred = clip_metrics(params, jnp.asarray(video.clips(frames, padded, nt)), model,
                                      layer_weights, time_weights)
        for name, values in jax.device_get(per_clip).items():
            sums[name] = sums.get(name, 0.0) + float(np.sum(values[:len(chunk)], dtype=np.float64))
        if first_predictions is None:
            first_predictions = np.asarray(pred[:len(chunk)])
    return {name: total / len(starts) for name, total in sums.items()}, first_predictions


def save_strip(path: Any, true: np.ndarray, predicted: np.ndarray, title: str) -> None:
    """PNG: the true frames [T, H, W, C] above the predicted ones, time left to right (matplotlib Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nt = len(true)
    fig = Figure(figsize=(1.2 * nt, 2.9))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, nt, squeeze=False)
    for t in range(nt):
        for row, (frames, label) in enumerate(((true, "true"), (predicted, "predicted"))):
            ax = axes[row, t]
            image = np.clip(frames[t], 0.0, 1.0)
            ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
            if t == 0:
                ax.set_ylabel(label)
        axes[0, t].set_title(f"t={t}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=100)


def make_predict(config: ml_collections.ConfigDict, params: Any):
    """A trained model's prediction (hwrepro.load): frames float [B, T, H, W, C] in [0, 1] -> next-frame
    predictions float32 [B, T, H, W, C] (prediction t is made from frames before t), as NumPy."""
    model = make_model(config, output_mode="prediction", unroll=1)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    forward = jax.jit(lambda frames: model.apply({"params": params}, frames).astype(jnp.float32))
    return lambda frames: np.asarray(forward(jnp.asarray(frames, jnp.float32)))


def run(config: ml_collections.ConfigDict, rec: Run) -> tuple[dict[str, Any], Any]:
    """Trains and evaluates PredNet as the config says; returns (final metrics, parameters)."""
    d, t = config.data, config.train
    splits = data.load(config, "video")
    starts = {"val": video.sequence_starts(splits.val.sources, d.nt, "unique")[:d.num_val_clips or None],
              "test": video.sequence_starts(splits.test.sources, d.nt, "unique")[:d.num_test_clips or None]}
    rec.note_data(splits.train.source, val=splits.val.source, test=splits.test.source,
                  train_frames=len(splits.train.frames), val_clips=len(starts["val"]),
                  test_clips=len(starts["test"]))

    steps_per_epoch = max(t.samples_per_epoch // t.batch_size, 1)
    num_steps = t.num_steps or t.num_epochs * steps_per_epoch
    init_key, order_key = jax.random.split(jax.random.key(config.seed))
    state = create_state(config, init_key, num_steps)
    state = state.replace(params=trained.start_from(config, state.params, rec))
    rec.note("param_count", param_count(state.params))
    layer_weights = jnp.asarray(layer_loss_weights(config.model.layer_loss_weights, len(config.model.stack_sizes)))
    time_weights = jnp.asarray(time_loss_weights(d.nt))
    batches = video.batches(splits.train, d.nt, t.batch_size,
                            seed=int(jax.random.randint(order_key, (), 0, 2 ** 31 - 1)))
    step = functools.partial(train_step, layer_weights=layer_weights, time_weights=time_weights)
    eval_model = make_model(config, output_mode="all", unroll=1)  # forward only: the loop is fast enough
    evaluate_on = functools.partial(evaluate, nt=d.nt, batch_size=config.eval.batch_size,
                                    layer_weights=layer_weights, time_weights=time_weights)

    def eval_fn(s: train_state.TrainState) -> dict[str, float]:
        metrics, _ = evaluate_on(s.params, eval_model, splits.val, starts["val"])
        return {k: metrics[k] for k in ("loss", "mse", "mse_copy_last")}

    probe = jnp.asarray(video.clips(splits.val, starts["val"][:t.batch_size], d.nt))
    at_snapshot = snapshotter(rec, lambda s: s.params,
                                 loss_fn=functools.partial(loss_fn, apply_fn=state.apply_fn,
                                                           layer_weights=layer_weights, time_weights=time_weights),
                                 probe_batch=probe, hessian_iters=t.hessian_iters, key=jax.random.key(d.seed))
    state = fit(state, step, batches, num_steps=num_steps, examples_per_step=t.batch_size, rec=rec,
                log_every=t.log_every, steps_per_epoch=steps_per_epoch, eval_fn=eval_fn,
                eval_every=t.eval_every, snapshot_every=snapshot_spacing(num_steps, t.checkpoints),
                snapshot_fn=at_snapshot, checkpoint_every=t.checkpoint_every, checkpoint_keep=t.checkpoint_keep)

    final, predictions = evaluate_on(state.params, eval_model, splits.test, starts["test"])
    if config.eval.extrap_start_time:
        extrap_model = make_model(config, output_mode="all", extrap_start_time=config.eval.extrap_start_time,
                                  unroll=1)
        extrap, _ = evaluate_on(state.params, extrap_model, splits.test, starts["test"])
        final.update({k: v for k, v in extrap.items() if k.startswith("extrap")})
    final = {f"test_{k}": v for k, v in final.items()}
    final["test_mse_ratio"] = final["test_mse"] / final["test_mse_copy_last"]
    strip = rec.workdir / "predictions.png"
    save_strip(strip, video.clips(splits.test, starts["test"][:1], d.nt)[0], predictions[0],
               f"{config.name}: test clip 0, true (top) vs PredNet next-frame prediction (bottom)")
    rec.print(f"test next-frame MSE {final['test_mse']:.6g} vs copy-last-frame {final['test_mse_copy_last']:.6g} "
              f"(ratio {final['test_mse_ratio']:.3f}); SSIM {final['test_ssim']:.4f} vs "
              f"{final['test_ssim_copy_last']:.4f}; frames in {strip.name}")
    final.update(steps=num_steps, epochs=num_steps / steps_per_epoch, param_count=param_count(state.params))
    return final, state.params
