"""hwrepro.study.hessian against dense Hessians (jax.hessian) and numpy.linalg.eigh."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from hwrepro.study import hessian

# Compiling is most of these tests' time and none checks bits or numerics of the optimized code.
pytestmark = pytest.mark.usefixtures("unoptimized_module")

# Symmetric and indefinite (eigenvalues on both sides of 0), with a coupling between all blocks.
A = np.array([
    [2.0, 1.0, 0.0, 0.0, 0.0, 0.0],
    [1.0, -3.0, 0.5, 0.0, 0.0, 0.0],
    [0.0, 0.5, 1.0, 0.0, 0.2, 0.0],
    [0.0, 0.0, 0.0, -1.0, 0.0, 0.3],
    [0.0, 0.0, 0.2, 0.0, 4.0, 0.7],
    [0.0, 0.0, 0.0, 0.3, 0.7, 0.5],
])
A_EIGENVALUES = np.linalg.eigh(A)[0]
# Lanczos of the matrix A itself, 3 iterations, compiled once for the tests that use it.
LANCZOS_3 = jax.jit(functools.partial(hessian.lanczos, lambda v: jnp.asarray(A, jnp.float32) @ v, 6, 3))
QUAD_PARAMS = {"u": jnp.array([0.3, -1.2]), "w": jnp.array([[0.5, 2.0], [-0.7, 0.1]])}


def quadratic_loss(params, a):
    """0.5 x^T A x of the ravelled params x, so the Hessian is A whatever x is."""
    x = ravel_pytree(params)[0]
    return 0.5 * x @ a @ x


def mlp_loss(params, batch):
    """Mean squared error of a tanh MLP (din -> hidden -> dout)."""
    x, y = batch
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def linear_loss(params, batch):
    """A loss with zero Hessian: Lanczos finds an invariant Krylov space at once."""
    return jnp.sum(ravel_pytree(params)[0] * batch)


@pytest.fixture(scope="module")
def mlp():
    """Params (P = 4*8 + 8 + 8*3 + 3 = 67), a batch, and the dense Hessian's eigenvalues (float64)."""
    rng = np.random.default_rng(0)  # numpy draws: no per-op compiles for the test's inputs
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    params = {"w1": normal(4, 8), "b1": 0.1 * normal(8), "w2": normal(8, 3) / 3, "b2": jnp.zeros(3)}
    batch = (normal(16, 4), normal(16, 3))
    flat, unravel = ravel_pytree(params)
    dense = jax.jit(jax.hessian(lambda f: mlp_loss(unravel(f), batch)))(flat)
    return params, batch, np.asarray(dense), np.linalg.eigh(np.asarray(dense, np.float64))[0]


def test_hvp_equals_dense_hessian_times_v(mlp):
    params, batch, dense, _ = mlp
    flat, unravel = ravel_pytree(params)
    v = jnp.asarray(np.random.default_rng(1).standard_normal(flat.shape), jnp.float32)
    hv = jax.jit(hessian.hvp, static_argnums=0)(mlp_loss, params, batch, unravel(v))
    assert jax.tree.structure(hv) == jax.tree.structure(params)
    np.testing.assert_allclose(ravel_pytree(hv)[0], dense @ v, rtol=1e-4, atol=1e-5)


def test_flat_hvp_of_quadratic_is_a_times_v():
    matvec, dim = hessian.flat_hvp(quadratic_loss, QUAD_PARAMS, jnp.asarray(A, jnp.float32))
    assert dim == 6
    np.testing.assert_allclose(jax.jit(matvec)(jnp.arange(1.0, 7.0)), A @ np.arange(1.0, 7.0), rtol=1e-6)


def test_lanczos_full_space_gives_all_eigenvalues_of_quadratic():
    ev = hessian.hessian_eigenvalues(quadratic_loss, QUAD_PARAMS, jnp.asarray(A, jnp.float32),
                                     jax.random.key(0), 6)
    np.testing.assert_allclose(ev, A_EIGENVALUES, rtol=1e-5, atol=1e-5)


def test_extreme_eigenvalues_of_indefinite_quadratic_flag_the_saddle():
    largest, smallest = hessian.extreme_eigenvalues(quadratic_loss, QUAD_PARAMS, jnp.asarray(A, jnp.float32),
                                                    jax.random.key(3), 50)  # capped at P = 6
    assert float(smallest) < 0
    np.testing.assert_allclose([largest, smallest], A_EIGENVALUES[[-1, 0]], rtol=1e-5)


def test_num_iters_beyond_dimension_is_capped():
    # Same arguments as the saddle test above, so the compiled function is reused.
    ev = hessian.hessian_eigenvalues(quadratic_loss, QUAD_PARAMS, jnp.asarray(A, jnp.float32),
                                     jax.random.key(3), 50)
    assert ev.shape == (6,)
    np.testing.assert_allclose(ev, A_EIGENVALUES, rtol=1e-5, atol=1e-5)


def test_few_iterations_give_ritz_values_inside_the_spectrum():
    # Cauchy interlacing: eigenvalues of V^T A V (V orthonormal) lie within [lambda_min, lambda_max].
    result = LANCZOS_3(jax.random.key(5))
    assert result.eigenvalues.shape == (3,) and result.alphas.shape == (3,) and result.betas.shape == (2,)
    ritz = np.asarray(result.eigenvalues)
    assert (ritz >= A_EIGENVALUES[0] - 1e-5).all() and (ritz <= A_EIGENVALUES[-1] + 1e-5).all()


def test_mlp_extreme_eigenvalues_match_dense_hessian_with_fewer_iterations_than_parameters(mlp):
    params, batch, _, dense_eigenvalues = mlp
    largest, smallest = hessian.extreme_eigenvalues(mlp_loss, params, batch, jax.random.key(2), 30)
    assert dense_eigenvalues.size == 67
    np.testing.assert_allclose(float(largest), dense_eigenvalues[-1], rtol=1e-3)
    np.testing.assert_allclose(float(smallest), dense_eigenvalues[0], rtol=1e-3)
    assert dense_eigenvalues[0] < 0 and float(smallest) < 0  # this random MLP sits at a saddle


def test_zero_hessian_breakdown_gives_zeros_not_nan():
    params = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
    ev = hessian.hessian_eigenvalues(linear_loss, params, jnp.arange(7.0), jax.random.key(0), 5)
    assert ev.shape == (5,)
    np.testing.assert_array_equal(ev, np.zeros(5))


def test_lanczos_runs_under_jit_and_is_deterministic_in_its_key():
    first, again, other = LANCZOS_3(jax.random.key(7)), LANCZOS_3(jax.random.key(7)), LANCZOS_3(jax.random.key(8))
    np.testing.assert_array_equal(first.eigenvalues, again.eigenvalues)
    assert not np.array_equal(first.alphas, other.alphas)  # the start vector comes from the key


def test_bad_num_iters_is_rejected():
    with pytest.raises(ValueError, match="num_iters"):
        hessian.lanczos(lambda v: v, 3, 0, jax.random.key(0))


def test_exhausted_krylov_space_restarts_and_still_finds_every_eigenvalue():
    # Three distinct eigenvalues: the Krylov space of any start vector has dimension 3, so Lanczos must
    # restart (beta = 0) twice to fill 6 iterations; T's blocks then hold the multiplicities too.
    diagonal = jnp.array([1.0, 1.0, 1.0, 2.0, 2.0, -3.0])
    result = jax.jit(functools.partial(hessian.lanczos, lambda v: diagonal * v, 6, 6))(jax.random.key(0))
    assert int(np.sum(np.asarray(result.betas) == 0.0)) == 2
    np.testing.assert_allclose(result.eigenvalues, np.sort(np.asarray(diagonal)), rtol=1e-5, atol=1e-5)
