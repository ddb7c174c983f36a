"""SLIDE's algorithms: LSH tables over output neurons, candidate selection, the row-sparse Adam, the jitted
training steps (LSH, sampled and dense softmax) and evaluation. Knows nothing of files, configs or logging.

    from hwrepro import sparse
    state = sparse.init_state(key, num_features, num_labels, method="lsh")
    step = sparse.make_train_step("lsh", learning_rate=1e-3, num_candidates=8192)
    state, metrics = step(state, batch, key)
    ids = sparse.topk(state.params, batch, k=5);  sparse.precision_at_k(ids, batch["labels"])

Submodules: `lsh` (hash families by name, bucket tables, queries, rebuild schedule), `hashes` (the hash
families), `candidates`, `sparse_adam`, `training`, `evaluation`. Importing this package imports JAX.
"""

from hwrepro.sparse import lsh, sparse_adam
from hwrepro.sparse.candidates import (CANDIDATE_MODES, SAMPLERS, batch_shared_candidates, per_example_candidates,
                                       sample_labels, unique_rows)
from hwrepro.sparse.evaluation import (blocked_top_k, inference_tables, lsh_logits, precision_at_k, topk, topk_lsh,
                                       topk_lsh_scored, topk_scored)
from hwrepro.sparse.training import (METHODS, Batch, LshSpec, Params, SlideState, changed_rows_per_step, init_params,
                                     init_state, make_train_step, model_params, rebuild, redraw, refile)

__all__ = [
    "CANDIDATE_MODES", "METHODS", "SAMPLERS", "Batch", "LshSpec", "Params", "SlideState", "batch_shared_candidates",
    "blocked_top_k", "changed_rows_per_step", "inference_tables", "init_params", "init_state", "lsh", "lsh_logits",
    "make_train_step", "model_params", "per_example_candidates", "precision_at_k", "rebuild", "redraw", "refile",
    "sample_labels", "sparse_adam", "topk", "topk_lsh", "topk_lsh_scored", "topk_scored", "unique_rows",
]
