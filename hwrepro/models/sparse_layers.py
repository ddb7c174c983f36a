"""SLIDE's extreme-classification network as Flax modules and the pure functions behind them.

The network (SLIDE's Amazon-670K model): a sparse input x, given as feature ids and values (the shared batch
format: `feat_ids` int32 [B, F] padded with num_features, `feat_vals` [B, F] zero at padding), a hidden layer
h = ReLU(sum_f val_f * E[id_f] + b1) with E [num_features, hidden], and an output layer W [num_labels, hidden],
b [num_labels] scored only at candidate output neurons during training.

The input layer is a gather and a weighted sum, never a dense num_features-wide product. The output layer is
written as a function of *gathered rows* (`candidate_logits(W_rows, b_rows, h)`): a training step gathers the
candidate rows once and differentiates with respect to those rows, so no [num_labels, hidden] gradient is ever
built. Dense scoring (evaluation, the dense baseline) is the same function applied to all of W. The modules
call exactly these functions, so a module and the training core (hwrepro.sparse) compute the same numbers.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


DType = Any
Initializer = Callable[..., jax.Array]


def gather_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table [N, ...] at ids [...] -> [..., ...]; ids >= N (padding) read zeros."""
    return table.at[ids].get(mode="fill", fill_value=0)


def embedding_sum(rows: jax.Array, vals: jax.Array, bias: jax.Array, dtype: DType = jnp.float32) -> jax.Array:
    """Hidden activations from the gathered input rows.

    Args:
      rows: [B, F, H] the embedding rows of each example's active features (zeros at padding).
      vals: [B, F] the feature values (zero at padding).
      bias: [H] the hidden bias.
      dtype: compute dtype of the product; accumulation is float32.

    Returns:
      h float32 [B, H] = ReLU(sum_f vals[b, f] * rows[b, f] + bias).
    """
    return jax.nn.relu(feature_sum(rows, vals, dtype) + bias.astype(jnp.float32))


def feature_sum(rows: jax.Array, vals: jax.Array, dtype: DType = jnp.float32) -> jax.Array:
    """The hidden layer before its bias and ReLU: float32 [B, H] = sum_f vals[b, f] * rows[b, f] (rows
    [B, F, H], vals [B, F]). A sum over features, so parts over disjoint feature sets add up (an embedding
    split by feature over devices: hwrepro.sparse.sharded)."""
    return jnp.einsum("bf,bfh->bh", vals.astype(dtype), rows.astype(dtype), preferred_element_type=jnp.float32)


def sparse_hidden(
    embedding: jax.Array, bias: jax.Array, feat_ids: jax.Array, feat_vals: jax.Array, dtype: DType = jnp.float32
) -> jax.Array:
    """h float32 [B, H] for a batch (feat_ids [B, F] padded with num_features, feat_vals [B, F])."""
    return embedding_sum(gather_rows(embedding, feat_ids), feat_vals, bias, dtype)


def candidate_logits(w_rows: jax.Array, b_rows: jax.Array, h: jax.Array, dtype: DType = jnp.float32) -> jax.Array:
    """Logits of the candidate output neurons, from their gathered rows.

    Args:
      w_rows: [M, H] rows shared by the batch, or [B, M, H] rows per example.
      b_rows: [M] or [B, M] their biases.
      h: [B, H] hidden activations.
      dtype: compute dtype of the product; accumulation and the result are float32.

    Returns:
      float32 [B, M] logits. With w_rows = W and b_rows = b this is the dense layer.
    """
    h = h.astype(dtype)
    w_rows = w_rows.astype(dtype)
    if w_rows.ndim == 2:
        z = jnp.einsum("bh,mh->bm", h, w_rows, preferred_element_type=jnp.float32)
    else:
        z = jnp.einsum("bh,bmh->bm", h, w_rows, preferred_element_type=jnp.float32)
    return z + b_rows.astype(jnp.float32)


def output_logits(
    weight: jax.Array,
    bias: jax.Array,
    h: jax.Array,
    candidates: jax.Array | None = None,
    dtype: DType = jnp.float32,
) -> jax.Array:
    """Logits [B, M] at candidates ([M] shared or [B, M] per example), or dense logits [B, num_labels] when
    candidates is None. A padding candidate (id >= num_labels) gets logit -inf, so it takes no part in a
    softmax, a cross-entropy or a top-k (the one padding convention of this module)."""
    if candidates is None:
        return candidate_logits(weight, bias, h, dtype)
    z = candidate_logits(gather_rows(weight, candidates), gather_rows(bias, candidates), h, dtype)
    return jnp.where(candidates < weight.shape[0], z, -jnp.inf)


def softmax_xent(logits: jax.Array, targets: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean softmax cross-entropy over the (active) output neurons.

    Args:
      logits: float32 [B, M].
      targets: [B, M] target distribution per example (SLIDE: 1/|labels| on each true label), rows summing
        to 1; to less where some of an example's labels are not among the candidates (more labels than M),
        to 0 for a padding example, which then contributes nothing.
      mask: [M] or [B, M] bool, False at padding candidates (excluded from the softmax), or None.

    Returns:
      scalar sum_b (w_b logsumexp(z_b) - <t_b, z_b>) / B with w_b = sum(t_b); its gradient with respect to the
      logits is (w_b p - t) / B: for an example whose labels are all candidates (w_b = 1), SLIDE's
      (1/|labels| - p) / B with the sign of a gradient.
    """
    if mask is None:
        mask = jnp.ones((), bool)
    return _xent(logits, targets, jnp.broadcast_to(mask, logits.shape))


@jax.custom_vjp
def _xent(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    return _xent_fwd(logits, targets, mask)[0]


def _xent_fwd(logits, targets, mask):
    # One exp pass serves the loss and the gradient (autodiff of logsumexp would exponentiate twice):
    # at M = 8192 the softmax passes cost as much as the candidate matmul itself.
    weight = jnp.sum(targets, axis=-1, keepdims=True)
    z_max = jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1, keepdims=True)
    e = jnp.where(mask, jnp.exp(logits - z_max), 0.0)
    s = jnp.sum(e, axis=-1, keepdims=True)
    lse = z_max + jnp.log(s)
    tz = jnp.sum(jnp.where(targets > 0, targets * logits, 0.0), axis=-1, keepdims=True)
    loss = jnp.sum(weight * lse - tz) / logits.shape[0]
    return loss, (e * (weight / s), targets, mask)


def _xent_bwd(res, g):
    p_weighted, targets, mask = res
    scale = g / p_weighted.shape[0]
    return scale * (p_weighted - targets), None, None


_xent.defvjp(_xent_fwd, _xent_bwd)


def label_targets(labels: jax.Array, num_labels: int, columns: jax.Array | None = None,
                  width: int | None = None) -> jax.Array:
    """Normalised multi-label targets float32 [B, width]: 1/|labels_b| at each true label's column.

    labels [B, L] padded with num_labels. By default the column is the label id (dense targets, width
    num_labels); `columns` [B, L] puts each label elsewhere, e.g. at its slot in a candidate set of `width`
    (columns >= width are dropped).
    """
    valid = labels < num_labels
    per = 1.0 / jnp.maximum(jnp.sum(valid, axis=1, keepdims=True), 1)
    rows = jnp.broadcast_to(jnp.arange(labels.shape[0])[:, None], labels.shape)
    t = jnp.zeros((labels.shape[0], num_labels if width is None else width), jnp.float32)
    return t.at[rows, labels if columns is None else columns].add(jnp.where(valid, per, 0.0), mode="drop")


class SparseInput(nn.Module):
    """Embedding-sum input layer: h = ReLU(sum_f val_f * E[id_f] + b1), float32 [B, features].

    Params: `embedding` [num_features, features] (param_dtype), `bias` [features] (float32).
    """

    num_features: int
    features: int = 128
    param_dtype: DType = jnp.float32
    dtype: DType = jnp.float32
    embedding_init: Initializer = nn.initializers.normal(0.01)

    def setup(self) -> None:
        self.embedding = self.param(
            "embedding", self.embedding_init, (self.num_features, self.features), self.param_dtype)
        self.bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)

    def __call__(self, feat_ids: jax.Array, feat_vals: jax.Array) -> jax.Array:
        return sparse_hidden(self.embedding, self.bias, feat_ids, feat_vals, self.dtype)


class SparseOutput(nn.Module):
    """Output layer over num_labels neurons, scored at candidates (e.g. LSH-retrieved ones,
    hwrepro.sparse.evaluation.lsh_logits) or densely.

    Params: `weight` [num_labels, features] (param_dtype; one row per output neuron, the layout LSH tables
    hash), `bias` [num_labels] (float32). `features` is the input's last dimension, as for nn.Dense. Padding
    candidates (id num_labels) score -inf.
    """

    num_labels: int
    param_dtype: DType = jnp.float32
    dtype: DType = jnp.float32
    weight_init: Initializer = nn.initializers.normal(0.01)

    @nn.compact
    def _params(self, features: int) -> tuple[jax.Array, jax.Array]:
        weight = self.param("weight", self.weight_init, (self.num_labels, features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.num_labels,), jnp.float32)
        return weight, bias

    def __call__(self, h: jax.Array, candidates: jax.Array | None = None) -> jax.Array:
        """Logits [B, M] at candidates ([M] or [B, M]), or dense [B, num_labels] when candidates is None."""
        weight, bias = self._params(h.shape[-1])
        return output_logits(weight, bias, h, candidates, self.dtype)
