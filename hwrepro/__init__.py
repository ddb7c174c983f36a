"""hwrepro: how hardware and numerics change what deep networks learn, and SLIDE-style sparse training.

Importing the package does not import JAX: numerics settings (XLA_FLAGS, thread affinity) must be applied
before JAX initialises, so only the modules that need JAX import it.
"""

__version__ = "0.1.0"

# The public API: what README's "Using the modules" and "Extending" show, by dotted name. A test imports each
# one, so moving or renaming one is a deliberate break, recorded in CHANGELOG.md with the old and new spelling.
PUBLIC_API = (
    "hwrepro.load",
    "hwrepro.harness.trained.Trained",
    "hwrepro.harness.numerics.apply_before_jax",
    "hwrepro.sparse.init_state",
    "hwrepro.sparse.make_train_step",
    "hwrepro.sparse.rebuild",
    "hwrepro.sparse.topk",
    "hwrepro.sparse.topk_scored",
    "hwrepro.sparse.topk_lsh_scored",
    "hwrepro.sparse.inference_tables",
    "hwrepro.sparse.precision_at_k",
    "hwrepro.sparse.model_params",
    "hwrepro.sparse.LshSpec",
    "hwrepro.sparse.lsh.init_hash",
    "hwrepro.sparse.lsh.build_tables",
    "hwrepro.sparse.lsh.query",
    "hwrepro.sparse.lsh.RebuildSchedule",
    "hwrepro.sparse.sparse_adam.row_adam",
    "hwrepro.sparse.hashes.FAMILIES",
    "hwrepro.models.MODELS",
    "hwrepro.models.SparseInput",
    "hwrepro.models.SparseOutput",
    "hwrepro.data.register",
    "hwrepro.data.xc.read_xc",
    "hwrepro.data.xc.read_points",
    "hwrepro.data.xc.label_data",
    "hwrepro.experiments.slide.make_predict",
    "hwrepro.harness.loop.fit",
)


def load(workdir):
    """The model a finished run kept in `workdir`: config, params and predict (hwrepro.harness.trained.load;
    imports JAX)."""
    from hwrepro.harness import trained

    return trained.load(workdir)
