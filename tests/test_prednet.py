"""PredNet and its ConvLSTM cell against a numpy re-implementation, hand-worked cases, and the reference's
parameter count; the experiment end to end on the small config."""

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from hwrepro.harness.config import load_config_file
from hwrepro.experiments import prednet as experiment
from hwrepro.models.convlstm import ConvLSTMCell, ConvLSTMState, hard_sigmoid
from hwrepro.models.predictive_coding import (PredNet, PredNetOutput, layer_loss_weights, param_count,
                                    reference_param_count, time_loss_weights, weighted_error_loss)

# Compiling is most of these tests' time and none checks bits or numerics of the optimized code, except those
# that take `optimized`.
pytestmark = pytest.mark.usefixtures("unoptimized_module")

REPO = Path(__file__).resolve().parent.parent
TINY = dict(stack_sizes=(2, 3), R_stack_sizes=(3, 4), A_filt_sizes=(3,), Ahat_filt_sizes=(3, 1),
            R_filt_sizes=(3, 3))          # 2 layers, mixed filter sizes, R sizes != stack sizes
TINY3 = dict(stack_sizes=(1, 3, 4), R_stack_sizes=(2, 3, 4), A_filt_sizes=(3, 3), Ahat_filt_sizes=(3, 3, 3),
             R_filt_sizes=(3, 3, 3))      # 3 layers
B, NT, H, W = 2, 3, 8, 8


def load_config(name):
    return load_config_file(REPO / "configs" / f"{name}.py")


def frames_for(sizes, key=1, nt=NT):
    return jax.random.uniform(jax.random.key(key), (B, nt, H, W, sizes["stack_sizes"][0]))


def random_params(sizes, seed=0, bias_scale=0.4):
    """Parameters of the model's shapes (from eval_shape: nothing compiled), kernels N(0, 0.4^2) and biases
    N(0, bias_scale^2), so that no term of the step is trivially zero."""
    frames = jnp.zeros((1, 1, H, W, sizes["stack_sizes"][0]))
    shapes = jax.eval_shape(lambda: PredNet(**sizes).init(jax.random.key(0), frames)["params"])
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, s: jnp.asarray((0.4 if path[-1].key == "kernel" else bias_scale) * rng.standard_normal(s.shape),
                                    jnp.float32), shapes)


@functools.partial(jax.jit, static_argnames="model")
def apply(model, params, frames):
    return model.apply({"params": params}, frames)


# ----------------------------------------------------------------------------------------- numpy reference

def np_conv(x, kernel, bias):
    """'SAME' cross-correlation, [B, H, W, Cin] x [kh, kw, Cin, Cout] -> [B, H, W, Cout], odd kernels."""
    kh, kw = kernel.shape[:2]
    xp = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    out = sum(xp[:, i:i + x.shape[1], j:j + x.shape[2]] @ kernel[i, j] for i in range(kh) for j in range(kw))
    return out + bias


def np_hard_sigmoid(x):
    return np.clip(0.2 * x + 0.5, 0.0, 1.0)


def np_prednet(params, frames, stack, r_stack, pixel_max=1.0):
    """The paper's equations, written out plainly: returns predictions [B, T, H, W, C], errors [B, T, L]."""
    p = jax.tree_util.tree_map(np.asarray, params)["step"]
    frames = np.asarray(frames, np.float64)
    n, nt, height, width, _ = frames.shape
    layers = len(stack)
    r = [np.zeros((n, height >> l, width >> l, r_stack[l])) for l in range(layers)]
    c = [np.zeros_like(x) for x in r]
    e = [np.zeros((n, height >> l, width >> l, 2 * stack[l])) for l in range(layers)]
    predictions, errors = [], []
    for t in range(nt):
        for l in reversed(range(layers)):
            parts = [r[l], e[l]] + ([r[l + 1].repeat(2, 1).repeat(2, 2)] if l < layers - 1 else [])
            g = p[f"lstm_{l}"]["gates"]
            gi, gf, gg, go = np.split(np_conv(np.concatenate(parts, -1), g["kernel"], g["bias"]), 4, axis=-1)
            c[l] = np_hard_sigmoid(gf) * c[l] + np_hard_sigmoid(gi) * np.tanh(gg)
            r[l] = np_hard_sigmoid(go) * np.tanh(c[l])
        a = frames[:, t]
        for l in range(layers):
            ahat = np.maximum(np_conv(r[l], p[f"ahat_{l}"]["kernel"], p[f"ahat_{l}"]["bias"]), 0)
            if l == 0:
                ahat = np.minimum(ahat, pixel_max)
                predictions.append(ahat)
            e[l] = np.concatenate([np.maximum(ahat - a, 0), np.maximum(a - ahat, 0)], -1)
            if l < layers - 1:
                conv = np.maximum(np_conv(e[l], p[f"a_{l}"]["kernel"], p[f"a_{l}"]["bias"]), 0)
                a = conv.reshape(n, conv.shape[1] // 2, 2, conv.shape[2] // 2, 2, -1).max(axis=(2, 4))
        errors.append([x.mean(axis=(1, 2, 3)) for x in e])
    return np.stack(predictions, 1), np.transpose(np.array(errors), (2, 0, 1))


# ----------------------------------------------------------------------------------------------- the cell

def test_hard_sigmoid_is_keras_definition():
    x = jnp.array([-5.0, -2.5, 0.0, 1.0, 2.5, 5.0])
    np.testing.assert_allclose(hard_sigmoid(x), [0.0, 0.0, 0.5, 0.7, 1.0, 1.0], atol=1e-7)


def test_convlstm_cell_step_matches_numpy():
    cell = ConvLSTMCell(features=3, kernel_size=(3, 3))
    x = jax.random.normal(jax.random.key(0), (2, 6, 5, 4))
    state = ConvLSTMState(c=jax.random.normal(jax.random.key(1), (2, 6, 5, 3)),
                          h=jax.random.normal(jax.random.key(2), (2, 6, 5, 3)))
    params = cell.init(jax.random.key(3), state, x)["params"]
    params["gates"]["bias"] = jax.random.normal(jax.random.key(4), (12,))
    new_state, h = cell.apply({"params": params}, state, x)
    gi, gf, gg, go = np.split(np_conv(np.concatenate([state.h, x], -1), np.asarray(params["gates"]["kernel"]),
                                      np.asarray(params["gates"]["bias"])), 4, axis=-1)
    c = np_hard_sigmoid(gf) * np.asarray(state.c) + np_hard_sigmoid(gi) * np.tanh(gg)
    np.testing.assert_allclose(new_state.c, c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, np_hard_sigmoid(go) * np.tanh(c), rtol=1e-5, atol=1e-5)
    # One bias per gate (as the reference's one Conv2D per gate), not flax ConvLSTMCell's two.
    assert param_count(params) == 4 * (9 * 7 * 3 + 3)


def test_convlstm_init_has_per_gate_glorot_scale():
    cell = ConvLSTMCell(features=64, kernel_size=(3, 3))
    z = jnp.zeros((1, 4, 4, 64))
    kernel = cell.init(jax.random.key(0), ConvLSTMState(z, z), z)["params"]["gates"]["kernel"]
    limit = np.sqrt(6.0 / (9 * 128 + 9 * 64))  # glorot_uniform of one [3, 3, 128, 64] Keras Conv2D kernel
    assert limit * 0.99 < float(jnp.abs(kernel).max()) <= limit * (1 + 1e-6)
    np.testing.assert_allclose(float(jnp.std(kernel)), limit / np.sqrt(3), rtol=0.02)


# ----------------------------------------------------------------------------------------------- PredNet

@pytest.mark.parametrize("sizes", [TINY, TINY3])
def test_steps_match_numpy_reference(sizes):
    model = PredNet(**sizes, output_mode="all")
    frames = frames_for(sizes)
    params = random_params(sizes)
    out = apply(model, params, frames)
    predictions, errors = np_prednet(params, frames, sizes["stack_sizes"], sizes["R_stack_sizes"])
    np.testing.assert_allclose(out.prediction, predictions, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.errors, errors, rtol=1e-4, atol=1e-6)


def test_first_step_from_zero_state_by_hand():
    """Zero state and zero biases (Keras' init, and this model's): every LSTM input is 0, so i = f = o = 0.5,
    g = 0, R = 0, Ahat = ReLU(0) = 0, and E_0 = [0, A]: the layer-0 error at t=0 is mean(frame) / 2,
    whatever the kernels."""
    model = PredNet(**TINY, output_mode="all")
    frames = frames_for(TINY)
    params = random_params(TINY, bias_scale=0.0)
    out = apply(model, params, frames)
    np.testing.assert_array_equal(out.prediction[:, 0], 0.0)
    np.testing.assert_allclose(out.errors[:, 0, 0], frames[:, 0].mean(axis=(1, 2, 3)) / 2, rtol=1e-6)


def _constant_predictor(level, bias_a0):
    """Parameters with every kernel 0: Ahat_0 = min(ReLU(ahat_0 bias), pixel_max), A_1 = ReLU(a_0 bias) and
    Ahat_1 = ReLU(ahat_1 bias), whatever R is."""
    model = PredNet(**TINY, output_mode="all")
    frames = jnp.full((B, NT, H, W, 2), level)
    params = jax.tree_util.tree_map(jnp.zeros_like, random_params(TINY))
    step = params["step"]
    step["ahat_0"]["bias"] = jnp.full((2,), level)
    step["a_0"]["bias"] = jnp.full((3,), bias_a0)
    step["ahat_1"]["bias"] = jnp.full((3,), bias_a0)
    step["lstm_0"]["gates"]["bias"] = jnp.linspace(-1.0, 1.0, 12)  # R non-zero: it must not matter
    return model, frames, params


def test_error_units_exactly_zero_when_prediction_equals_input():
    model, frames, params = _constant_predictor(0.375, 0.25)
    out = apply(model, params, frames)
    np.testing.assert_array_equal(out.prediction, 0.375)
    np.testing.assert_array_equal(out.errors, 0.0)


def test_prediction_clipped_at_pixel_max():
    model, frames, params = _constant_predictor(2.0, 0.25)
    out = apply(model, params, frames)
    np.testing.assert_array_equal(out.prediction, 1.0)
    np.testing.assert_allclose(out.errors[..., 0], 0.5, rtol=1e-6)  # E_0 = [0, 2 - 1]: mean 0.5


def test_output_shapes_for_every_mode():
    frames = frames_for(TINY3)
    params = random_params(TINY3)

    def shape_of(**kw):
        return jax.eval_shape(lambda: PredNet(**TINY3, **kw).apply({"params": params}, frames))

    assert shape_of(output_mode="prediction").shape == (B, NT, H, W, 1)
    assert shape_of(output_mode="error").shape == (B, NT, 3)
    out = shape_of(output_mode="all")
    assert isinstance(out, PredNetOutput)
    assert out.prediction.shape == (B, NT, H, W, 1) and out.errors.shape == (B, NT, 3)
    assert out.prediction.dtype == jnp.float32
    low = shape_of(output_mode="all", dtype=jnp.bfloat16)
    assert low.prediction.dtype == jnp.bfloat16 and low.errors.dtype == jnp.float32
    with pytest.raises(ValueError, match="divisible by 4"):
        jax.eval_shape(lambda: PredNet(**TINY3).init(jax.random.key(0), frames[:, :, :6, :6]))
    with pytest.raises(ValueError, match="channels"):
        jax.eval_shape(lambda: PredNet(**TINY3).init(jax.random.key(0), jnp.zeros((1, 2, 8, 8, 3))))


def test_bf16_activations_track_fp32(optimized):
    frames = frames_for(TINY)
    params = random_params(TINY)
    high = apply(PredNet(**TINY, output_mode="all"), params, frames)
    low = apply(PredNet(**TINY, output_mode="all", dtype=jnp.bfloat16), params, frames)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    assert low.prediction.dtype == jnp.bfloat16
    np.testing.assert_allclose(low.errors, high.errors, rtol=0.05, atol=5e-3)
    assert not np.array_equal(np.asarray(low.errors), np.asarray(high.errors))


def test_extrapolation_feeds_predictions_back():
    frames = frames_for(TINY3)
    params = random_params(TINY3)
    plain = apply(PredNet(**TINY3, output_mode="all"), params, frames).prediction
    extrap_model = PredNet(**TINY3, output_mode="all", extrap_start_time=1)
    extrap = apply(extrap_model, params, frames).prediction
    np.testing.assert_array_equal(extrap[:, :2], plain[:, :2])  # prediction 1 is made before frame 1 is used
    assert float(jnp.abs(extrap[:, 2:] - plain[:, 2:]).max()) > 1e-4
    scrambled = frames.at[:, 1:].set(jax.random.uniform(jax.random.key(9), frames[:, 1:].shape))
    np.testing.assert_array_equal(apply(extrap_model, params, scrambled).prediction, extrap)  # frames 1.. unused


def test_loss_weights_and_layers_with_zero_weight():
    nt, layers = 5, 3
    np.testing.assert_array_equal(layer_loss_weights("L_0", 4), [1, 0, 0, 0])
    np.testing.assert_allclose(layer_loss_weights("L_all", 4), [1, 0.1, 0.1, 0.1])
    np.testing.assert_allclose(time_loss_weights(nt), [0, 0.25, 0.25, 0.25, 0.25])
    errors = jax.random.uniform(jax.random.key(0), (B, nt, layers))
    lw, tw = jnp.asarray(layer_loss_weights("L_0", layers)), jnp.asarray(time_loss_weights(nt))
    base = weighted_error_loss(errors, lw, tw)
    np.testing.assert_allclose(base, errors[:, 1:, 0].mean(axis=1).mean(), rtol=1e-6)
    # Layers weighted 0 and time step 0 contribute nothing: changing their errors leaves the loss as it is.
    assert weighted_error_loss(errors.at[:, :, 1:].add(7.0), lw, tw) == base
    assert weighted_error_loss(errors.at[:, 0].add(7.0), lw, tw) == base
    grad = jax.grad(weighted_error_loss)(errors, lw, tw)
    np.testing.assert_allclose(grad, np.broadcast_to(np.outer(tw, lw) / B, grad.shape), rtol=1e-6)
    lw_all = jnp.asarray(layer_loss_weights("L_all", layers))
    delta = weighted_error_loss(errors.at[:, 2, 1].add(1.0), lw_all, tw) - weighted_error_loss(errors, lw_all, tw)
    np.testing.assert_allclose(delta, 0.1 * 0.25, rtol=1e-5)


def test_gradients_reach_every_layer_through_the_pixel_loss():
    """With L_0 (pixel errors only) every parameter still gets gradient: higher layers reach the pixel
    prediction through the top-down R path at the next time step."""
    model = PredNet(**TINY3)
    frames = frames_for(TINY3)
    params = random_params(TINY3, bias_scale=0.0)
    lw, tw = jnp.asarray(layer_loss_weights("L_0", 3)), jnp.asarray(time_loss_weights(NT))
    grads = jax.jit(jax.grad(lambda p: weighted_error_loss(model.apply({"params": p}, frames), lw, tw)))(params)
    norms = {"/".join(k): float(jnp.linalg.norm(v)) for k, v in flatten_dict(grads).items()}
    assert len(norms) == 2 * (3 + 3 + 2)  # kernel and bias of lstm_0..2, ahat_0..2, a_0..1
    assert all(n > 0 for n in norms.values()), norms


def test_kitti_parameter_count_equals_reference():
    sizes = dict(stack_sizes=(3, 48, 96, 192), R_stack_sizes=(3, 48, 96, 192), A_filt_sizes=(3, 3, 3),
                 Ahat_filt_sizes=(3, 3, 3, 3), R_filt_sizes=(3, 3, 3, 3))
    shapes = jax.eval_shape(lambda: PredNet(**sizes).init(jax.random.key(0), jnp.zeros((1, 2, 128, 160, 3))))
    assert reference_param_count(**sizes) == 6_915_948  # worked out by hand in docs/prednet.md
    assert param_count(shapes["params"]) == 6_915_948


@pytest.mark.slow
def test_same_seed_gives_identical_parameters_and_steps(optimized):
    """The experiment's own init (twice with seed 0, once with seed 1) and training step (twice from the
    same state, on separate buffers: the step donates its input)."""
    config = load_config("prednet_small")
    config.data.image_size = (H, W)
    config.model.update(TINY)  # 2 layers: the optimized init and step compile faster than with TINY3
    config.data.channels = TINY["stack_sizes"][0]
    frames = jnp.asarray(frames_for(TINY, nt=2))  # the step unrolls the clip: 2 frames compile faster than 3
    lw, tw = jnp.asarray(layer_loss_weights("L_0", 2)), jnp.asarray(time_loss_weights(2))
    state = experiment.create_state(config, jax.random.key(0), num_steps=10)
    init = jax.tree_util.tree_map(np.asarray, state.params)
    again = experiment.create_state(config, jax.random.key(0), num_steps=10).params
    other = experiment.create_state(config, jax.random.key(1), num_steps=10).params
    for x, y in zip(jax.tree_util.tree_leaves(init), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(x, y)
    assert not any(np.array_equal(x, y) for k, x, y in zip(flatten_dict(init), jax.tree_util.tree_leaves(init),
                                                          jax.tree_util.tree_leaves(other)) if k[-1] == "kernel")
    assert all(not np.any(b) for k, b in flatten_dict(init).items() if k[-1] == "bias")  # Keras: zeros

    copy = state.replace(params=jax.tree_util.tree_map(jnp.array, init),
                         opt_state=jax.tree_util.tree_map(jnp.array, state.opt_state))
    stepped = [jax.tree_util.tree_map(np.asarray, experiment.train_step(s, frames, lw, tw)[0].params)
               for s in (state, copy)]
    for x, y, z in zip(*map(jax.tree_util.tree_leaves, (stepped[0], stepped[1], init))):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(jax.tree_util.tree_leaves(stepped[0]),
                                                        jax.tree_util.tree_leaves(init)))


def test_ssim_against_numpy_and_identity():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(2, 16, 13, 2))
    y = np.clip(x + 0.1 * rng.normal(size=x.shape), 0, 1)
    np.testing.assert_allclose(experiment.ssim(jnp.asarray(x), jnp.asarray(x)), 1.0, rtol=1e-5)
    g = np.exp(-((np.arange(11) - 5.0) ** 2) / (2 * 1.5 ** 2))
    window = np.outer(g, g) / np.outer(g, g).sum()

    def blur(z):  # valid 11x11 Gaussian filter of [N, H, W, C], one output pixel at a time
        n, height, width, c = z.shape
        out = np.zeros((n, height - 10, width - 10, c))
        for i in range(height - 10):
            for j in range(width - 10):
                out[:, i, j] = np.einsum("ij,nijc->nc", window, z[:, i:i + 11, j:j + 11])
        return out

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx ** 2, blur(y * y) - my ** 2, blur(x * y) - mx * my
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    expected = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    expected = expected.mean(axis=(1, 2, 3))
    np.testing.assert_allclose(experiment.ssim(jnp.asarray(x), jnp.asarray(y)), expected, rtol=1e-4)


# ------------------------------------------------------------------------------------------- experiment

@pytest.mark.slow
def test_small_config_beats_copy_last_frame(optimized, tmp_path):
    """The experiment end to end (runner, record, PNG strip) on the small config, shortened."""
    from hwrepro.harness import runner

    config = load_config("prednet_small")
    config.train.num_steps = 120
    config.train.batch_size = 8
    config.data.nt = 6  # compile time grows with the unrolled clip
    config.train.log_every = 40
    config.data.synthetic.num_videos = 48
    config.data.synthetic_eval_videos = 8
    final = runner.run_here(config, tmp_path / "run", quiet=True)
    assert final["test_mse"] < 0.7 * final["test_mse_copy_last"], final
    assert final["test_ssim"] > final["test_ssim_copy_last"], final
    assert (tmp_path / "run" / "predictions.png").stat().st_size > 1000
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 120 and lines[-1]["loss"] < lines[0]["loss"]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["data_source"].startswith("synthetic")
