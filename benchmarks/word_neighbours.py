"""What a word2vec run learned: the nearest neighbours (cosine) of a few words in its input embeddings.

    python benchmarks/word_neighbours.py RUN_DIR [--words water,king,red] [--k 8]

RUN_DIR is a finished run of configs/slide_text8.py (or a sampled/dense variant) with train.checkpoints >= 1,
so that trajectory.npz holds its parameters; the last snapshot is used. The corpus is rebuilt from the run's
config.json (same file, same vocabulary). Without --words, the words of frequency ranks 50, 100, 200, 400,
800 and 1600 are queried (a choice made before looking). As yardsticks the script also prints the cosine
of random word pairs among the 10,000 most frequent words, and the P@k on the run's held-out pairs of always
predicting the k most frequent words (what a model that learned only word frequencies scores).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_RANKS = (50, 100, 200, 400, 800, 1600)


def input_embeddings(run_dir: Path, vocab_size: int, hidden: int) -> tuple[int, np.ndarray]:
    """(step, float32 [V, hidden]): the centre-word embedding table E at the run's last snapshot."""
    import jax
    from jax.flatten_util import ravel_pytree

    from hwrepro.sparse.training import init_params

    with np.load(run_dir / "trajectory.npz") as z:
        step, flat = int(z["steps"][-1]), z["params"][-1]
    shapes = jax.eval_shape(lambda: init_params(jax.random.key(0), vocab_size, vocab_size, hidden))
    template = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, np.float32), shapes)
    params = ravel_pytree(template)[1](flat)
    return step, np.asarray(params["input"]["embedding"], dtype=np.float32)


def nearest(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int [Q, k], cosines float [Q, k]): each query row's k most cosine-similar rows, itself left out."""
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = unit[queries] @ unit.T
    sims[np.arange(len(queries)), queries] = -np.inf
    ids = np.argsort(-sims, axis=1)[:, :k]
    return ids, np.take_along_axis(sims, ids, axis=1)


def random_pair_cosine(vectors: np.ndarray, top: int, n: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """Mean and 99th percentile of the cosine of n random pairs of distinct words among the `top` most frequent."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, top, n), rng.integers(0, top, n)
    a, b = a[a != b], b[a != b]
    unit = vectors[:top] / np.maximum(np.linalg.norm(vectors[:top], axis=1, keepdims=True), 1e-12)
    cos = np.sum(unit[a] * unit[b], axis=1)
    return float(cos.mean()), float(np.percentile(cos, 99))


def frequency_baseline(config, corpus, ks=(1, 3, 5)) -> dict[str, float]:
    """P@k on the run's held-out evaluation pairs when the k most frequent words are always predicted."""
    from hwrepro.data import text8

    labels = text8.label_data(config).test.batch["labels"]         # [n, 2 * window], padding = vocab size
    hits = labels[:, :, None] == np.arange(max(ks))[None, None, :]   # ids are ranks: 0 = most frequent
    found = hits.any(axis=1)                                         # [n, max k]: rank-r word is a context word
    has = (labels < corpus.vocab_size).any(axis=1)
    return {f"P@{k}": float(found[has, :k].sum(axis=1).mean() / k) for k in ks}


def main(argv: list[str] | None = None) -> int:
    import ml_collections

    from hwrepro.data import text8

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--words", default="", help="comma-separated query words (default: fixed frequency ranks)")
    p.add_argument("--k", type=int, default=8)
    args = p.parse_args(argv)

    config = ml_collections.ConfigDict(json.loads((args.run_dir / "config.json").read_text()))
    if not (args.run_dir / "trajectory.npz").is_file():
        print(f"error: {args.run_dir}: no trajectory.npz (run with --config.train.checkpoints=1)", file=sys.stderr)
        return 2
    corpus = text8.load_corpus(config.data)
    step, vectors = input_embeddings(args.run_dir, corpus.vocab_size, config.model.hidden)
    index = {w: i for i, w in enumerate(corpus.words)}
    names = args.words.split(",") if args.words else [corpus.words[r] for r in DEFAULT_RANKS if r < corpus.vocab_size]
    unknown = [w for w in names if w not in index]
    if unknown:
        print(f"error: not in the vocabulary: {', '.join(unknown)}", file=sys.stderr)
        return 2
    queries = np.array([index[w] for w in names])
    ids, cos = nearest(vectors, queries, args.k)
    mean, p99 = random_pair_cosine(vectors, min(10_000, corpus.vocab_size))
    print(f"{config.name} ({config.model.method}), step {step}, corpus {corpus.source}: "
          f"{len(corpus.tokens):,} words, vocabulary {corpus.vocab_size:,}")
    base = frequency_baseline(config, corpus)
    final = json.loads((args.run_dir / "final.json").read_text()) if (args.run_dir / "final.json").is_file() else {}
    print("held-out P@1/3/5: this run " + "/".join(f"{final.get(f'test_{k}', float('nan')):.4f}" for k in base)
          + "; always the most frequent words " + "/".join(f"{v:.4f}" for v in base.values()))
    print(f"random pairs among the {min(10_000, corpus.vocab_size):,} most frequent words: "
          f"mean cosine {mean:.3f}, 99th percentile {p99:.3f}")
    for q, row, c in zip(queries, ids, cos):
        near = ", ".join(f"{corpus.words[i]} {s:.2f}" for i, s in zip(row, c))
        print(f"{corpus.words[q]} (rank {q}): {near}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
