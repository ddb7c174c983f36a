"""Hessian spectrum of a training loss: Hessian-vector products and Lanczos.

The saddle-point diagnostic: if the smallest Hessian eigenvalue at a checkpoint is negative, the loss has a
direction of negative curvature there (a saddle, not a minimum), and where training stops on different
hardware may differ in which saddles it escaped. A Hessian of P parameters is P x P and never formed: Lanczos
needs only products H v, which forward-over-reverse differentiation gives at about the cost of two gradients.

Everything works on a parameter pytree by flattening it with `jax.flatten_util.ravel_pytree` to one vector of
length P. Lanczos keeps all m Krylov vectors (m x P floats) for full reorthogonalisation: without it, rounding
makes the vectors lose orthogonality and the extreme eigenvalues appear as spurious copies ("ghosts").
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

PyTree = Any
LossFn = Callable[[PyTree, Any], jax.Array]  # loss_fn(params, batch) -> scalar


class LanczosResult(NamedTuple):
    """The m x m tridiagonal matrix T = V^T A V and its eigenvalues (Ritz values), ascending.

    alphas: [m] diagonal; betas: [m-1] off-diagonal (0 where the Krylov space was exhausted and Lanczos
    restarted from a fresh random direction); eigenvalues: [m] ascending.
    """
    eigenvalues: jax.Array
    alphas: jax.Array
    betas: jax.Array


def hvp(loss_fn: LossFn, params: PyTree, batch: Any, v: PyTree) -> PyTree:
    """H v for the Hessian H of loss_fn(., batch) at params; v and the result have params' structure.

    Forward-over-reverse (jvp of grad): one forward-mode pass through the gradient computation, cheaper in
    memory than reverse-over-reverse and exact (no finite differences).
    """
    grad_fn = lambda p: jax.grad(loss_fn)(p, batch)
    return jax.jvp(grad_fn, (params,), (v,))[1]


def flat_hvp(loss_fn: LossFn, params: PyTree, batch: Any,
             dtype: Any = None) -> tuple[Callable[[jax.Array], jax.Array], int]:
    """(matvec, P): matvec maps a [P] vector to H @ v as a [P] vector, for the ravelled params.

    The products are returned in `dtype` (default: params' dtype promoted to at least float32), because
    Lanczos in bf16 would lose the orthogonality it depends on; v is cast to the params' dtype on the way in.
    """
    flat, unravel = ravel_pytree(params)
    if dtype is None:
        dtype = jnp.promote_types(flat.dtype, jnp.float32)

    def matvec(v: jax.Array) -> jax.Array:
        hv = hvp(loss_fn, params, batch, unravel(v.astype(flat.dtype)))
        return ravel_pytree(hv)[0].astype(dtype)

    return matvec, int(flat.size)


def _orthogonalize(w: jax.Array, basis: jax.Array) -> jax.Array:
    """w minus its projection on the rows of basis [k, P] (rows orthonormal or zero), done twice.

    One classical Gram-Schmidt pass leaves an error proportional to the rounding in w; a second pass makes
    it negligible ("twice is enough", Kahan/Parlett). Zero rows (vectors not yet computed) project to zero.
    """
    for _ in range(2):
        w = w - basis.T @ (basis @ w)
    return w


def lanczos(matvec: Callable[[jax.Array], jax.Array], dim: int, num_iters: int, key: jax.Array,
            dtype: Any = jnp.float32) -> LanczosResult:
    """Lanczos with full reorthogonalisation for the symmetric operator `matvec` on [dim] vectors.

    num_iters (m) is capped at dim: an m-dimensional Krylov space cannot exceed the whole space, and with
    m = dim the Ritz values are all the eigenvalues. The start vector is drawn from `key`. The extreme Ritz
    values converge first, so m of a few tens usually pins down the largest and smallest eigenvalues.
    Pure JAX with a fixed iteration count (`lax.fori_loop`), so it runs under jit with dim and num_iters
    static. Memory: (m + 1) x dim floats for the Krylov basis.
    """
    if num_iters < 1:
        raise ValueError(f"num_iters must be at least 1, got {num_iters}")
    if dim < 1:
        raise ValueError(f"dim must be at least 1, got {dim}")
    m = min(int(num_iters), int(dim))
    eps = jnp.finfo(dtype).eps
    start_key, restart_key = jax.random.split(key)
    v0 = jax.random.normal(start_key, (dim,), dtype)
    basis = jnp.zeros((m + 1, dim), dtype).at[0].set(v0 / jnp.linalg.norm(v0))

    def fresh_direction(j, basis):
        # The Krylov space is invariant (beta ~ 0): continue from a random direction orthogonal to it, and
        # record beta = 0 so T splits into blocks whose eigenvalues are still eigenvalues of the operator.
        r = _orthogonalize(jax.random.normal(jax.random.fold_in(restart_key, j), (dim,), dtype), basis)
        return r / jnp.linalg.norm(r), jnp.zeros((), dtype)

    def step(j, carry):
        basis, alphas, betas = carry
        v = basis[j]
        av = matvec(v).astype(dtype)
        alpha = jnp.vdot(v, av)
        # Full reorthogonalisation also removes the three-term recurrence's alpha v_j + beta v_{j-1}.
        w = _orthogonalize(av, basis)
        beta = jnp.linalg.norm(w)
        scale = jnp.maximum(jnp.linalg.norm(av), jnp.finfo(dtype).tiny)
        next_v, beta = jax.lax.cond(
            beta <= 10 * eps * scale,
            fresh_direction,
            lambda j, basis: (w / beta, beta),
            j, basis)
        return basis.at[j + 1].set(next_v), alphas.at[j].set(alpha), betas.at[j].set(beta)

    init = (basis, jnp.zeros((m,), dtype), jnp.zeros((m,), dtype))
    _, alphas, betas = jax.lax.fori_loop(0, m, step, init)
    betas = betas[:m - 1]  # the last beta couples to v_m, which is outside the m-dimensional space
    tridiagonal = jnp.diag(alphas) + jnp.diag(betas, 1) + jnp.diag(betas, -1)
    return LanczosResult(jnp.linalg.eigh(tridiagonal)[0], alphas, betas)


@functools.partial(jax.jit, static_argnums=(0, 4))
def hessian_eigenvalues(loss_fn: LossFn, params: PyTree, batch: Any, key: jax.Array,
                        num_iters: int) -> jax.Array:
    """Ritz values [min(num_iters, P)], ascending, of the Hessian of loss_fn(., batch) at params.

    loss_fn must be hashable (a module-level function, not a fresh lambda per call) to reuse the compile.
    """
    matvec, dim = flat_hvp(loss_fn, params, batch)
    dtype = jnp.promote_types(ravel_pytree(params)[0].dtype, jnp.float32)
    return lanczos(matvec, dim, num_iters, key, dtype).eigenvalues


def extreme_eigenvalues(loss_fn: LossFn, params: PyTree, batch: Any, key: jax.Array,
                        num_iters: int) -> tuple[jax.Array, jax.Array]:
    """(largest, smallest) Hessian eigenvalue estimates, as 0-d arrays; smallest < 0 means a saddle."""
    eigenvalues = hessian_eigenvalues(loss_fn, params, batch, key, num_iters)
    return eigenvalues[-1], eigenvalues[0]
