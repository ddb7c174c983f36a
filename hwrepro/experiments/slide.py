"""SLIDE: extreme classification (Amazon-670K, WikiLSH-325K) and word2vec (Text8) with an LSH-sparse output
layer, against sampled and dense full softmax in the same code path (`model.method`).

The loop is the shared `fit`; what is SLIDE's own here: the table-rebuild schedule (timed, since rebuilds are
part of SLIDE's cost), precision@k on a fixed shuffled test subset during training and on the whole test split
at the end (dense scoring, plus LSH scoring for the lsh method).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hwrepro import lsh, numerics, slide
from hwrepro.data import text8, xc
from hwrepro.errors import ConfigError
from hwrepro.records import Run
from hwrepro.train_loop import Progress, fit

XC_DATASETS = tuple(xc.SHAPES)
DATASETS = XC_DATASETS + ("text8",)
KS = (1, 3, 5)


def validate(config: ml_collections.ConfigDict) -> None:
    m, d = config.model, config.data
    checks = [("data.dataset", d.dataset, DATASETS), ("model.method", m.method, slide.METHODS),
              ("model.candidate_mode", m.candidate_mode, slide.CANDIDATE_MODES),
              ("model.sampler", m.sampler, slide.SAMPLERS), ("lsh.kind", config.lsh.kind, slide.LSH_KINDS)]
    for name, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")
    for name in ("model.hidden", "model.num_candidates", "model.bucket_capacity", "model.min_count",
                 "data.max_features", "data.max_labels", "lsh.num_hashes", "lsh.num_tables", "lsh.bin_size",
                 "lsh.rebuild_period", "eval.subset", "eval.batch_size"):
        group, field = name.split(".")
        if config[group][field] <= 0:
            raise ConfigError(f"{name}={config[group][field]} must be positive")
    if config.eval.final_points < 0:
        raise ConfigError(f"eval.final_points={config.eval.final_points} must not be negative")
    if d.dataset == "text8" and m.candidate_mode == "per_example" and m.num_candidates < 2 * d.window:
        raise ConfigError(f"model.num_candidates={m.num_candidates} is below the {2 * d.window} context words")


def lsh_spec(config: ml_collections.ConfigDict) -> slide.LshSpec:
    """The output layer's hash family as the config's `lsh` fields give it."""
    c = config.lsh
    return slide.LshSpec(kind=c.kind, num_hashes=c.num_hashes, num_tables=c.num_tables, bin_size=c.bin_size,
                         density=c.density)


# ------------------------------------------------------------------------------------------------------ data


class Data:
    """Training batches, evaluation sets and their shape, whatever the data set."""

    def __init__(self, config: ml_collections.ConfigDict):
        d = config.data
        if d.dataset == "text8":
            self._init_text8(config)
        else:
            self._init_xc(config)

    def _init_xc(self, config):
        d = config.data
        train, test = xc.load_splits(d.dir or None, d.dataset, seed=d.seed, num_train=d.num_train or None,
                                     num_test=d.num_test or None)
        self.source = train.source if "synthetic" in train.source else f"{train.source} + {test.source}"
        self.num_features, self.num_labels = train.num_features, train.num_labels
        self.num_train = train.num_points
        self.batcher = xc.XCBatcher(train, d.max_features, d.max_labels)
        final = test if not config.eval.final_points else xc.fixed_subset(test, config.eval.final_points, d.seed)
        self.test = xc.XCBatcher(final, d.max_features, d.max_labels)
        self.num_test = final.num_points
        self.subset = xc.XCBatcher(xc.fixed_subset(test, config.eval.subset, d.seed), d.max_features,
                                   d.max_labels)
        self.steps_per_epoch = self.batcher.steps_per_epoch(config.train.batch_size)
        self.details = {"num_train": train.num_points, "num_test": test.num_points,
                        "num_final_eval": final.num_points,
                        "num_features": train.num_features, "num_labels": train.num_labels,
                        "truncation_train": vars(self.batcher.truncation),
                        "features_per_point": float(train.features_per_point().mean()),
                        "labels_per_point": float(train.labels_per_point().mean())}
        self._train_batches = lambda: self.batcher.epochs(config.train.batch_size, seed=config.seed)

    def _init_text8(self, config):
        d = config.data
        path = str(Path(d.dir) / "text8") if d.dir else None
        sizes = {"num_tokens": d.num_train} if d.num_train else {}
        corpus = text8.load_corpus(path, seed=d.seed, min_count=d.min_count, **sizes)
        self.source = corpus.source
        self.num_features = self.num_labels = corpus.vocab_size
        # Held-out pairs: the last 5% of the corpus, never trained on; the first 95% is the training text.
        cut = int(len(corpus.tokens) * 0.95)
        train_corpus = dataclasses.replace(corpus, tokens=corpus.tokens[:cut])
        held_out = np.arange(cut, len(corpus.tokens) - d.window)
        rng = np.random.default_rng(d.seed)
        subset = np.sort(rng.choice(held_out, size=min(config.eval.subset, len(held_out)), replace=False))
        spans = np.full(len(subset), d.window)
        batch = text8.skipgram_batch(corpus.tokens, subset, spans, d.window, corpus.vocab_size)
        self.subset = _StaticEval(batch, corpus.vocab_size, corpus.vocab_size)
        self.test = self.subset   # word2vec has no separate test split: the held-out text is it
        self.num_test = len(subset)
        self.num_train = cut
        self.steps_per_epoch = max(cut // config.train.batch_size, 1)
        self.details = {"tokens": len(corpus.tokens), "vocab_size": corpus.vocab_size, "train_tokens": cut}

        def endless():
            epoch = 0
            while True:
                yield from text8.skipgram_batches(train_corpus, config.train.batch_size, d.window,
                                                  seed=config.seed, epoch=epoch, sample=d.subsample)
                epoch += 1
        self._train_batches = endless

    def train_batches(self) -> Iterator[dict[str, np.ndarray]]:
        return self._train_batches()


class _StaticEval:
    """A fixed evaluation set held as one array set, cut into `ordered` batches like XCBatcher's."""

    def __init__(self, batch: dict[str, np.ndarray], num_features: int, num_labels: int):
        self.batch, self.num_features, self.num_labels = batch, num_features, num_labels

    def ordered(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, len(self.batch["labels"]), batch_size):
            part = {k: v[start:start + batch_size] for k, v in self.batch.items()}
            yield xc.pad_batch(part, batch_size, self.num_features, self.num_labels)


# ------------------------------------------------------------------------------------------------ evaluation


def evaluate(state: slide.SlideState, eval_set, batch_size: int, use_lsh: bool, bucket_capacity: int,
             dtype: Any, num_labels: int, progress: Progress | None = None) -> dict[str, float]:
    """P@1, P@3, P@5 over every point of `eval_set` (padding rows, mask False, are left out).

    `progress` (counting batches) is for the final evaluation, minutes long at Amazon-670K scale."""
    hits = {k: 0.0 for k in KS}
    count = 0
    for i, batch in enumerate(eval_set.ordered(batch_size), 1):
        del batch["mask"]  # padding rows have no labels: precision_at_k leaves them out
        if use_lsh:
            ids = slide.topk_lsh(state.params, state.hash_fn, state.tables, batch, max(KS),
                                 bucket_capacity=bucket_capacity, dtype=dtype)
        else:
            ids = slide.topk(state.params, batch, max(KS), dtype=dtype)
        labelled = int(np.any(batch["labels"] < num_labels, axis=1).sum())
        for name, p in slide.precision_at_k(ids, batch["labels"], KS, num_labels).items():
            hits[int(name[2:])] += float(p) * labelled
        count += labelled
        if progress is not None:
            progress.update(i, force=i == progress.total)
    return {f"P@{k}": hits[k] / max(count, 1) for k in KS}


# ------------------------------------------------------------------------------------------------------ run


def run(config: ml_collections.ConfigDict, rec: Run):
    m, d = config.model, config.data
    t_data = time.time()
    data = Data(config)
    rec.note_data(data.source, load_seconds=round(time.time() - t_data, 2), **data.details)
    if m.method != "dense" and m.num_candidates > data.num_labels:
        raise ConfigError(f"model.num_candidates={m.num_candidates} exceeds the {data.num_labels:,} labels of "
                          f"data.dataset={d.dataset!r}")
    rec.print(f"{data.num_features:,} features -> {m.hidden} hidden -> {data.num_labels:,} outputs, "
              f"method {m.method}" + (f" ({m.candidate_mode}, {m.num_candidates} candidates)"
                                      if m.method != "dense" else ""))
    compute_dtype = numerics.jnp_dtype(config.numerics.precision)
    spec = lsh_spec(config)
    init_key, step_key, table_key = jax.random.split(jax.random.key(config.seed), 3)
    state = slide.init_state(init_key, data.num_features, data.num_labels, m.hidden, method=m.method,
                             param_dtype=numerics.jnp_dtype(config.numerics.param_dtype), lsh_spec=spec)
    step_fn = slide.make_train_step(m.method, learning_rate=config.train.learning_rate,
                                    num_candidates=m.num_candidates, candidate_mode=m.candidate_mode,
                                    bucket_capacity=m.bucket_capacity, min_count=m.min_count, sampler=m.sampler,
                                    compute_dtype=compute_dtype)
    num_steps = config.train.num_steps or config.train.num_epochs * data.steps_per_epoch

    def train_step(state, batch):
        return step_fn(state, batch, jax.random.fold_in(step_key, state.step))

    schedule = lsh.RebuildSchedule(config.lsh.rebuild_period, config.lsh.rebuild_decay,
                                   config.lsh.redraw_period or None, config.lsh.redraw_decay)
    timing = {"rebuild_seconds": 0.0, "rebuilds": 0, "eval_seconds": 0.0}

    def after_step(step, state):
        if m.method != "lsh" or not schedule.due(step):
            return state
        jax.block_until_ready(state)  # steps still in flight are training time, not rebuild time
        t = time.time()
        key = jax.random.fold_in(table_key, step)
        state = slide.redraw(state, key) if schedule.redraw_due(step) else slide.rebuild(state, key)
        jax.block_until_ready(state.tables)
        timing["rebuild_seconds"] += time.time() - t
        timing["rebuilds"] += 1
        return state

    def eval_subset(state):
        t = time.time()
        out = evaluate(state, data.subset, config.eval.batch_size, False, m.bucket_capacity, compute_dtype,
                       data.num_labels)
        timing["eval_seconds"] += time.time() - t
        return out

    t_train = time.time()
    state = fit(state, train_step, data.train_batches(), num_steps=num_steps,
                examples_per_step=config.train.batch_size, rec=rec, log_every=config.train.log_every,
                steps_per_epoch=data.steps_per_epoch, eval_fn=eval_subset, eval_every=config.train.eval_every,
                after_step=after_step)
    train_seconds = time.time() - t_train - timing["eval_seconds"]

    final = {"method": m.method, "steps": num_steps, "epochs": num_steps / data.steps_per_epoch,
             "train_seconds": train_seconds,
             "seconds_per_epoch": train_seconds * data.steps_per_epoch / num_steps,
             "examples_per_s": num_steps * config.train.batch_size / train_seconds, **timing}
    t = time.time()
    num_batches = -(-data.num_test // config.eval.batch_size)
    for prefix, use_lsh in [("test_", False)] + ([("test_lsh_", True)] if m.method == "lsh" else []):
        scoring = "LSH-scored" if use_lsh else f"all {data.num_labels:,} labels scored"
        progress = Progress(num_batches, f"{config.name} final eval, {scoring}", unit="batch", units="batches")
        final.update({prefix + k: v for k, v in evaluate(
            state, data.test, config.eval.batch_size, use_lsh, m.bucket_capacity, compute_dtype,
            data.num_labels, progress).items()})
    final["final_eval_seconds"] = time.time() - t
    where = f" on {config.eval.final_points} test points" if config.eval.final_points else " on the whole test split"
    rec.print(f"{m.method}: {final['seconds_per_epoch']:.1f} s/epoch (rebuilds {timing['rebuild_seconds']:.1f} s), "
              + " ".join(f"P@{k} {final[f'test_P@{k}']:.4f}" for k in KS) + where)
    return final, slide.model_params(state.params)
