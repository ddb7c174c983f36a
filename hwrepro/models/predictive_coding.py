"""PredNet (Lotter, Kreiman & Cox 2016, "Deep predictive coding networks for video prediction").

Faithful to the paper and its reference Keras implementation (coxlab/prednet), written anew in Flax, NHWC.
Each layer l has four kinds of units: targets A_l, predictions Ahat_l, error units E_l and ConvLSTM
representation units R_l. One time step, given the state (R, C, E) of the previous step:

  top-down, l = L-1 .. 0:   R_l, C_l = ConvLSTM([R_l(t-1), E_l(t-1), up2(R_{l+1}(t))], C_l(t-1))
                            (up2 = 2x nearest upsampling; the top layer has no up2 term)
  bottom-up, l = 0 .. L-1:  Ahat_l = ReLU(conv(R_l));  Ahat_0 = min(Ahat_0, pixel_max)
                            E_l = [ReLU(Ahat_l - A_l), ReLU(A_l - Ahat_l)]   (channel concat)
                            A_{l+1} = maxpool2x2(ReLU(conv(E_l)));  A_0 = the frame

The gates use Keras' hard_sigmoid and the rest tanh, as the reference does. Every convolution is 'SAME'
with a bias; the initial state is zeros. The frame prediction at time t is Ahat_0(t), made before seeing
frame t (it depends on R_0(t), computed from step t-1's state only). The time loop is `nn.scan`.

Shapes: frames [B, T, H, W, C] in [0, pixel_max], with C == stack_sizes[0] and H, W divisible by
2 ** (len(stack_sizes) - 1). Parameters are fp32 (`param_dtype`); activations use `dtype` (fp32 or bf16).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hwrepro.models.convlstm import ConvLSTMCell, ConvLSTMState, hard_sigmoid
from hwrepro.models.model_registry import MODELS

OUTPUT_MODES = ("prediction", "error", "all")


class PredNetState(NamedTuple):
    """Recurrent state carried between time steps (per-layer tuples, bottom layer first).

    r, c: [B, H / 2**l, W / 2**l, R_stack_sizes[l]]; e: [B, H / 2**l, W / 2**l, 2 * stack_sizes[l]];
    prediction: the last frame prediction [B, H, W, stack_sizes[0]], fed back as input when extrapolating.
    """

    r: tuple[jax.Array, ...]
    c: tuple[jax.Array, ...]
    e: tuple[jax.Array, ...]
    prediction: jax.Array


class PredNetOutput(NamedTuple):
    """Output of output_mode='all': predictions [B, T, H, W, C] and per-layer mean errors [B, T, L] (fp32)."""

    prediction: jax.Array
    errors: jax.Array


def upsample2(x: jax.Array) -> jax.Array:
    """2x nearest-neighbour upsampling of [B, H, W, C] to [B, 2H, 2W, C] (Keras UpSampling2D)."""
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def maxpool2(x: jax.Array) -> jax.Array:
    """2x2 max-pooling, stride 2, of [B, H, W, C] (Keras MaxPooling2D defaults)."""
    return nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")


def error_units(ahat: jax.Array, a: jax.Array) -> jax.Array:
    """E = [ReLU(Ahat - A), ReLU(A - Ahat)] along channels: [B, H, W, C] x 2 -> [B, H, W, 2C]."""
    return jnp.concatenate([nn.relu(ahat - a), nn.relu(a - ahat)], axis=-1)


def layer_loss_weights(kind: str, num_layers: int) -> np.ndarray:
    """The paper's layer weights: 'L_0' = [1, 0, 0, ...] (trains on pixel errors only), 'L_all' = [1, 0.1, ...]."""
    if kind == "L_0":
        return np.array([1.0] + [0.0] * (num_layers - 1), np.float32)
    if kind == "L_all":
        return np.array([1.0] + [0.1] * (num_layers - 1), np.float32)
    raise ValueError(f"layer loss weights must be 'L_0' or 'L_all', got {kind!r}")


def time_loss_weights(nt: int) -> np.ndarray:
    """[0, 1/(nt-1), ..., 1/(nt-1)]: the first step's prediction is from a zero state, so it is not trained."""
    if nt < 2:
        raise ValueError(f"PredNet training needs nt >= 2 time steps, got {nt}")
    w = np.full((nt,), 1.0 / (nt - 1), np.float32)
    w[0] = 0.0
    return w


def weighted_error_loss(errors: jax.Array, layer_weights: jax.Array, time_weights: jax.Array) -> jax.Array:
    """The reference training loss from output_mode='error': errors [B, T, L] -> scalar.

    Per sequence: sum_t time_weights[t] * sum_l layer_weights[l] * errors[b, t, l]; then the batch mean
    (the reference's mean absolute error against a zero target, the weighted errors being non-negative).
    """
    per_sequence = jnp.einsum("btl,l,t->b", errors.astype(jnp.float32), layer_weights, time_weights)
    return jnp.mean(per_sequence)


def reference_param_count(
    stack_sizes: Sequence[int],
    R_stack_sizes: Sequence[int],
    A_filt_sizes: Sequence[int],
    Ahat_filt_sizes: Sequence[int],
    R_filt_sizes: Sequence[int],
) -> int:
    """Trainable parameters of the reference Keras PredNet, from its layer definitions (docs/prednet.md).

    Per layer l (L layers, s = stack_sizes, r = R_stack_sizes, k = filter sizes), every conv biased:
      R gates i, f, c, o: 4 * (kR_l^2 * (2 s_l + r_l + r_{l+1}) * r_l + r_l)   (r_{L} := 0)
      Ahat:               kAhat_l^2 * r_l * s_l + s_l
      A (l < L-1):        kA_l^2 * 2 s_l * s_{l+1} + s_{l+1}
    """
    num_layers = len(stack_sizes)
    total = 0
    for l in range(num_layers):
        r_above = R_stack_sizes[l + 1] if l < num_layers - 1 else 0
        lstm_in = 2 * stack_sizes[l] + R_stack_sizes[l] + r_above
        total += 4 * (R_filt_sizes[l] ** 2 * lstm_in * R_stack_sizes[l] + R_stack_sizes[l])
        total += Ahat_filt_sizes[l] ** 2 * R_stack_sizes[l] * stack_sizes[l] + stack_sizes[l]
        if l < num_layers - 1:
            total += A_filt_sizes[l] ** 2 * 2 * stack_sizes[l] * stack_sizes[l + 1] + stack_sizes[l + 1]
    return total


class PredNetStep(nn.Module):
    """One PredNet time step (module docstring); scanned over time by `PredNet`.

    Submodules: lstm_l (ConvLSTMCell, R_l), ahat_l (conv R_l -> Ahat_l), a_l (conv E_l -> A_{l+1}).
    """

    stack_sizes: tuple[int, ...]
    R_stack_sizes: tuple[int, ...]
    A_filt_sizes: tuple[int, ...]
    Ahat_filt_sizes: tuple[int, ...]
    R_filt_sizes: tuple[int, ...]
    pixel_max: float
    extrap_start_time: int | None
    gate_activation: Callable[[jax.Array], jax.Array]
    dtype: Any
    param_dtype: Any

    def _conv(self, features: int, size: int, name: str) -> nn.Conv:
        return nn.Conv(features, (size, size), padding="SAME", dtype=self.dtype,
                       param_dtype=self.param_dtype, name=name)

    @nn.compact
    def __call__(self, state: PredNetState, inputs: tuple[jax.Array, jax.Array]
                 ) -> tuple[PredNetState, tuple[jax.Array, jax.Array]]:
        """state: PredNetState; inputs: (frame [B, H, W, C], t int32 scalar).

        Returns (new state, (frame prediction [B, H, W, C], per-layer mean errors [B, L] fp32)).
        """
        frame, t = inputs
        num_layers = len(self.stack_sizes)
        a = frame.astype(self.dtype)
        if self.extrap_start_time is not None:
            # From extrap_start_time on, the model's own last prediction replaces the true frame.
            a = jnp.where(t >= self.extrap_start_time, state.prediction, a)

        r_new: list[jax.Array] = [None] * num_layers
        c_new: list[jax.Array] = [None] * num_layers
        r_up = None
        for l in reversed(range(num_layers)):
            lstm_inputs = [state.e[l]] if r_up is None else [state.e[l], r_up]
            cell = ConvLSTMCell(self.R_stack_sizes[l], (self.R_filt_sizes[l],) * 2,
                                gate_activation=self.gate_activation, dtype=self.dtype,
                                param_dtype=self.param_dtype, name=f"lstm_{l}")
            lstm_state, r = cell(ConvLSTMState(c=state.c[l], h=state.r[l]), jnp.concatenate(lstm_inputs, -1))
            r_new[l], c_new[l] = r, lstm_state.c
            r_up = upsample2(r)

        e_new: list[jax.Array] = []
        prediction = None
        for l in range(num_layers):
            ahat = nn.relu(self._conv(self.stack_sizes[l], self.Ahat_filt_sizes[l], f"ahat_{l}")(r_new[l]))
            if l == 0:
                ahat = jnp.minimum(ahat, self.pixel_max)
                prediction = ahat
            e_new.append(error_units(ahat, a))
            if l < num_layers - 1:
                a = maxpool2(nn.relu(self._conv(self.stack_sizes[l + 1], self.A_filt_sizes[l], f"a_{l}")(e_new[l])))

        # Mean over H, W and both error halves, in fp32 so bf16 runs do not lose the loss to rounding.
        errors = jnp.stack([jnp.mean(e.astype(jnp.float32), axis=(1, 2, 3)) for e in e_new], axis=-1)
        new_state = PredNetState(r=tuple(r_new), c=tuple(c_new), e=tuple(e_new), prediction=prediction)
        return new_state, (prediction, errors)


@MODELS.register("prednet")
class PredNet(nn.Module):
    """PredNet over a clip: frames [B, T, H, W, C] -> output chosen by `output_mode`.

    output_mode: 'prediction' -> frame predictions [B, T, H, W, C] (prediction t is made before frame t);
                 'error' -> per-layer mean error units [B, T, L] fp32 (what the training loss weights);
                 'all' -> PredNetOutput(prediction, errors).
    extrap_start_time: from this time index on, the model's previous prediction is its input (multi-step
    extrapolation); None = always the true frame. Defaults are the reference KITTI model.
    unroll: time steps per iteration of the scan's loop; None = all of them. The time loop is always
    `nn.scan` (lax.scan), but fully unrolled by default because XLA:CPU runs convolutions inside a while
    loop's body several times slower, backward passes most (timings: docs/prednet.md, "The time loop"). A
    loop (unroll=1) compiles faster: use it for long clips or on GPU.
    """

    stack_sizes: tuple[int, ...] = (3, 48, 96, 192)
    R_stack_sizes: tuple[int, ...] = (3, 48, 96, 192)
    A_filt_sizes: tuple[int, ...] = (3, 3, 3)
    Ahat_filt_sizes: tuple[int, ...] = (3, 3, 3, 3)
    R_filt_sizes: tuple[int, ...] = (3, 3, 3, 3)
    pixel_max: float = 1.0
    output_mode: str = "error"
    extrap_start_time: int | None = None
    gate_activation: Callable[[jax.Array], jax.Array] = hard_sigmoid
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    unroll: int | None = None

    def _check(self, frames: jax.Array) -> None:
        num_layers = len(self.stack_sizes)
        lengths = {"R_stack_sizes": (len(self.R_stack_sizes), num_layers),
                   "A_filt_sizes": (len(self.A_filt_sizes), num_layers - 1),
                   "Ahat_filt_sizes": (len(self.Ahat_filt_sizes), num_layers),
                   "R_filt_sizes": (len(self.R_filt_sizes), num_layers)}
        for name, (got, want) in lengths.items():
            if got != want:
                raise ValueError(f"PredNet {name} has {got} entries, expected {want} for {num_layers} layers")
        if self.output_mode not in OUTPUT_MODES:
            raise ValueError(f"PredNet output_mode must be one of {OUTPUT_MODES}, got {self.output_mode!r}")
        if frames.ndim != 5:
            raise ValueError(f"PredNet expects frames [B, T, H, W, C], got shape {frames.shape}")
        _, _, height, width, channels = frames.shape
        if channels != self.stack_sizes[0]:
            raise ValueError(f"frames have {channels} channels but stack_sizes[0] is {self.stack_sizes[0]}")
        factor = 2 ** (num_layers - 1)
        if height % factor or width % factor:
            raise ValueError(f"frame size {height}x{width} must be divisible by {factor} for {num_layers} layers")

    def initial_state(self, batch: int, height: int, width: int) -> PredNetState:
        """The zero state for a batch of [height, width] frames."""
        def zeros(l: int, channels: int) -> jax.Array:
            return jnp.zeros((batch, height >> l, width >> l, channels), self.dtype)

        layers = range(len(self.stack_sizes))
        r = tuple(zeros(l, self.R_stack_sizes[l]) for l in layers)
        e = tuple(zeros(l, 2 * self.stack_sizes[l]) for l in layers)
        return PredNetState(r=r, c=r, e=e, prediction=zeros(0, self.stack_sizes[0]))

    @nn.compact
    def __call__(self, frames: jax.Array) -> jax.Array | PredNetOutput:
        self._check(frames)
        batch, nt, height, width, _ = frames.shape
        scan_step = nn.scan(PredNetStep, variable_broadcast="params", split_rngs={"params": False},
                            in_axes=0, out_axes=0, unroll=self.unroll or nt)
        step = scan_step(tuple(self.stack_sizes), tuple(self.R_stack_sizes), tuple(self.A_filt_sizes),
                         tuple(self.Ahat_filt_sizes), tuple(self.R_filt_sizes), self.pixel_max,
                         self.extrap_start_time, self.gate_activation, self.dtype, self.param_dtype,
                         name="step")
        time_major = jnp.swapaxes(frames, 0, 1)
        _, (predictions, errors) = step(self.initial_state(batch, height, width),
                                        (time_major, jnp.arange(nt, dtype=jnp.int32)))
        predictions = jnp.swapaxes(predictions, 0, 1)
        errors = jnp.swapaxes(errors, 0, 1)
        if self.output_mode == "prediction":
            return predictions
        if self.output_mode == "error":
            return errors
        return PredNetOutput(prediction=predictions, errors=errors)


def param_count(params: Any) -> int:
    """Number of scalars in a parameter pytree."""
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
