"""Word2vec (skip-gram) data for Text8 or any plain-text corpus, in the shared batch format.

A skip-gram example is one centre word and the set of words around it. In the shared format that is
feat_ids [B, 1] = the centre word, feat_vals [B, 1] = 1, labels [B, 2 * window] = its distinct context words,
sorted, padded with vocab_size. As in word2vec.c, rare words are dropped from the text before windows are
taken (or, optionally, mapped to an UNK word), frequent words are subsampled afresh each epoch, and each
centre's window is shrunk to a random 1..window.

Corpora (`data.source`): "auto" reads the text8 file in data.dir (else the synthetic Zipfian stand-in),
"synthetic" forces the stand-in, "text" reads data.dir as any plain-text file (gzip, and so dictzip .dz,
read directly), tokenised as Text8 was made: lowercase, letters a-z only, every other byte a word break.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from hwrepro.data import register
from hwrepro.data.xc import LabelData, pad_batch
from hwrepro.errors import DataError

_BLOCK_BYTES = 1 << 23
_UNK = "<unk>"
_GZIP_MAGIC = b"\x1f\x8b"
# Text8's tokenisation as a byte table: A-Z -> a-z, a-z kept, every other byte (digits, punctuation, UTF-8
# sequences of accented letters) -> a blank, so words are maximal runs of ASCII letters.
_LETTERS_ONLY = bytes(c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 else 32 for c in range(256))
TEXT8_TOKENS = 17_005_207     # words in the text8 file
TEXT8_VOCAB = 71_290          # distinct words occurring at least 5 times


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
    """A tokenised corpus: word ids in text order and the vocabulary they index."""

    tokens: np.ndarray        # int32 [N] word ids, in text order
    words: tuple[str, ...]    # [V] id -> word; ids by decreasing count (ties: alphabetical), UNK first if any
    counts: np.ndarray        # int64 [V] occurrences of each id in `tokens`
    unk: int | None           # id of the UNK word when rare words were mapped to it, else None
    dropped: int              # occurrences of rare words removed from the text (0 when mapped to UNK)
    source: str

    @property
    def vocab_size(self) -> int:
        return len(self.words)


def build_corpus(raw_ids: np.ndarray, raw_words: list[str], min_count: int = 5, max_vocab: int | None = None,
                 rare: str = "drop", source: str = "") -> Corpus:
    """Vocabulary from provisional ids (`raw_ids` int [N] indexing `raw_words`).

    Keeps words seen at least min_count times, at most max_vocab of them (the most frequent; with rare='unk'
    the UNK word takes one of the max_vocab slots). The others are dropped from the text (rare='drop', what
    word2vec.c does) or replaced by UNK, id 0 (rare='unk').
    """
    if rare not in ("drop", "unk"):
        raise ValueError(f"rare must be 'drop' or 'unk', got {rare!r}")
    raw_counts = np.bincount(raw_ids, minlength=len(raw_words))
    order = sorted(range(len(raw_words)), key=lambda i: (-raw_counts[i], raw_words[i]))
    limit = len(order) if max_vocab is None else max_vocab - (rare == "unk")
    kept = [i for i in order[:limit] if raw_counts[i] >= min_count]
    offset = 1 if rare == "unk" else 0
    new_id = np.full(len(raw_words), -1, dtype=np.int64)
    new_id[kept] = np.arange(offset, offset + len(kept))
    tokens = new_id[raw_ids]
    rare_mask = tokens < 0
    n_rare = int(rare_mask.sum())
    words = [raw_words[i] for i in kept]
    if rare == "unk":
        tokens[rare_mask] = 0
        words = [_UNK] + words
    else:
        tokens = tokens[~rare_mask]
    tokens = tokens.astype(np.int32)
    return Corpus(tokens, tuple(words), np.bincount(tokens, minlength=len(words)).astype(np.int64),
                  0 if rare == "unk" else None, 0 if rare == "unk" else n_rare, source)


def _split_at_blank(chunk: bytes) -> int:
    """Length of the longest prefix of `chunk` that ends in whitespace (0 if none)."""
    return max(chunk.rfind(c) for c in (b" ", b"\n", b"\t", b"\r")) + 1


def _open_text(path: str):
    """The file as a binary stream, gunzipped when it starts with gzip's magic bytes (.gz, dictzip .dz)."""
    try:
        f = open(path, "rb")
        if f.read(2) == _GZIP_MAGIC:
            f.close()
            return gzip.open(path, "rb")
        f.seek(0)
        return f
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None


def read_text8(path: str | os.PathLike, min_count: int = 5, max_vocab: int | None = None,
               rare: str = "drop", letters_only: bool = False) -> Corpus:
    """Reads a whitespace-separated text (text8: one 100 MB line; gzip-compressed files too) in 8 MiB blocks.

    letters_only tokenises as Text8 was made (any text: lowercase, words = runs of letters a-z, any other byte
    a break, so the encoding does not matter); otherwise words are the whitespace-separated UTF-8 tokens as
    they are. Words become provisional int32 ids block by block (a dict of distinct words, never a list of
    all 17M words); build_corpus then sorts the vocabulary. DataError `path:line: ...` (with the byte offset)
    for a file that is empty, has NUL bytes (a binary file), is not UTF-8 (without letters_only; e.g. the
    unextracted text8.zip) or is a broken gzip file, and `path: ...` when no word occurs min_count times.
    """
    path = os.fspath(path)
    ids_of: dict[bytes, int] = {}
    parts: list[np.ndarray] = []
    offset, line, rest = 0, 1, b""                    # bytes and newlines before `rest`
    with _open_text(path) as f:
        while True:
            try:
                chunk = f.read(_BLOCK_BYTES)
            except (OSError, EOFError, zlib.error) as e:   # gzip.BadGzipFile is an OSError
                raise DataError.at(path, line, f"broken gzip data after byte offset {offset} of the "
                                               f"uncompressed text ({e or 'truncated'})") from None
            final = not chunk
            data = rest + chunk
            nul = data.find(b"\0")
            if nul >= 0:
                raise DataError.at(path, line + data.count(b"\n", 0, nul),
                                   f"not a text file: NUL byte at byte offset {offset + nul}")
            # Cut after the last blank: never inside a word, so never inside a UTF-8 sequence either.
            cut = len(data) if final else _split_at_blank(data)
            if not letters_only:
                try:
                    data[:cut].decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError.at(path, line + data.count(b"\n", 0, e.start),
                                       f"not UTF-8 text at byte offset {offset + e.start} (a compressed file?)") from None
            words = (data[:cut].translate(_LETTERS_ONLY) if letters_only else data[:cut]).split()
            for w in set(words).difference(ids_of):
                ids_of[w] = len(ids_of)
            parts.append(np.fromiter(map(ids_of.__getitem__, words), dtype=np.int32, count=len(words)))
            offset += cut
            line += data.count(b"\n", 0, cut)
            rest = data[cut:]
            if final:
                break
    if not ids_of:
        raise DataError.at(path, 1, "empty file: no words" + (" (no letters a-z)" if letters_only and offset else ""))
    raw_words = [w.decode("utf-8") for w in ids_of]    # dicts keep insertion order: index = provisional id
    raw_ids = np.concatenate(parts)
    corpus = build_corpus(raw_ids, raw_words, min_count, max_vocab, rare, source=path)
    if corpus.vocab_size == 0 or (rare == "unk" and corpus.vocab_size == 1):
        raise DataError(f"{path}: too few words for a vocabulary: none of its {len(raw_words):,} distinct words "
                        f"occurs {min_count} times or more ({len(raw_ids):,} words in all)")
    return corpus


def synthetic_corpus(num_tokens: int = TEXT8_TOKENS, vocab_size: int = TEXT8_VOCAB, num_topics: int = 100,
                     segment_length: float = 60.0, function_share: float = 0.3, seed: int = 0,
                     min_count: int = 1) -> Corpus:
    """A Zipfian corpus whose contexts are predictable; deterministic per seed.

    Word w (generative rank) has weight 1/(w+1). The vocabulary's 1% most frequent words are "function words"
    used everywhere; the rest are dealt round-robin to `num_topics` topics, so each topic has frequent and rare
    words. The text is a run of segments (geometric lengths, mean segment_length), each about one random
    topic: a word is a function word with probability function_share, else a word of the segment's topic, each
    drawn by weight. Centre and context words therefore share a topic, which a skip-gram model can learn;
    overall word frequencies stay close to Zipf's law. The vocabulary is then built as for a file
    (min_count 1 keeps every generated word; ids by decreasing realised count).
    """
    rng = np.random.default_rng(seed)
    num_function = max(1, vocab_size // 100)
    weight = 1.0 / np.arange(1, vocab_size + 1)
    group = np.empty(vocab_size, dtype=np.int64)       # topic of each word; num_topics = the function words
    group[:num_function] = num_topics
    group[num_function:] = np.arange(vocab_size - num_function) % num_topics
    # Inverse-CDF sampling for all groups at once: group g's cumulative weights are mapped into [g, g+1].
    by_group = np.argsort(group, kind="stable")
    g_sorted = group[by_group]
    cum = np.cumsum(weight[by_group])
    group_start = np.searchsorted(g_sorted, np.arange(num_topics + 1))
    before = np.where(group_start > 0, cum[np.maximum(group_start - 1, 0)], 0.0)
    total = np.diff(np.append(before, cum[-1]))
    level = g_sorted + (cum - before[g_sorted]) / total[g_sorted]
    level[np.append(group_start[1:] - 1, vocab_size - 1)] = np.arange(1, num_topics + 2)  # exact group ends

    n_segments = int(num_tokens / segment_length) + 1
    lengths = rng.geometric(1.0 / segment_length, n_segments)
    while lengths.sum() < num_tokens:                  # rare: top up so the segments cover num_tokens
        lengths = np.concatenate([lengths, rng.geometric(1.0 / segment_length, n_segments)])
    topic = np.repeat(rng.integers(0, num_topics, len(lengths)), lengths)[:num_tokens]
    source_group = np.where(rng.random(num_tokens) < function_share, num_topics, topic)
    pick = np.searchsorted(level, source_group + rng.random(num_tokens), side="right")
    raw_ids = by_group[np.minimum(pick, vocab_size - 1)]
    return build_corpus(raw_ids, [f"w{i}" for i in range(vocab_size)], min_count, None, "drop",
                        source=f"synthetic Zipfian topic corpus (seed {seed}, {num_tokens} tokens, "
                               f"{vocab_size} words, {num_topics} topics)")


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """float64 [V]: probability that an occurrence of each word survives subsampling.

    word2vec.c's formula, keep = (sqrt(f / t) + 1) * t / f with f the word's share of the text and t =
    `sample` (word2vec.c default 1e-3), capped at 1; sample=0 keeps everything. (The paper's 1 - sqrt(t / f)
    discard rule differs slightly; the code's is what word2vec results were produced with.)
    """
    counts = np.asarray(counts, dtype=np.float64)
    if sample <= 0:
        return np.ones_like(counts)
    f = counts / counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = (np.sqrt(f / sample) + 1.0) * sample / f
    return np.where(f > 0, np.minimum(keep, 1.0), 1.0)


def subsample(tokens: np.ndarray, keep_prob: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The tokens that survive one draw of subsampling (order kept)."""
    return tokens[rng.random(len(tokens)) < keep_prob[tokens]]


def skipgram_batch(tokens: np.ndarray, centres: np.ndarray, spans: np.ndarray, window: int,
                   vocab_size: int) -> dict[str, np.ndarray]:
    """Skip-gram examples for positions `centres` (int [B]) of `tokens`.

    Context of a centre at position c: the words at c-s..c-1 and c+1..c+s (s = spans[i] in 1..window),
    clipped to the text, duplicates removed. Returns the shared format: feat_ids int32 [B, 1] (centre word),
    feat_vals float32 [B, 1] (ones), labels int32 [B, 2 * window] (distinct context ids ascending, then
    vocab_size padding).
    """
    offsets = np.concatenate([np.arange(-window, 0), np.arange(1, window + 1)])
    pos = centres[:, None] + offsets[None, :]
    valid = (np.abs(offsets)[None, :] <= spans[:, None]) & (pos >= 0) & (pos < len(tokens))
    ctx = np.where(valid, tokens[np.clip(pos, 0, len(tokens) - 1)], vocab_size).astype(np.int32)
    ctx.sort(axis=1)
    repeat = np.zeros_like(valid)
    repeat[:, 1:] = ctx[:, 1:] == ctx[:, :-1]
    ctx[repeat] = vocab_size
    ctx.sort(axis=1)                                   # padding (the largest id) to the end
    return {"feat_ids": tokens[centres].astype(np.int32)[:, None],
            "feat_vals": np.ones((len(centres), 1), dtype=np.float32),
            "labels": ctx}


def skipgram_batches(corpus: Corpus, batch_size: int, window: int, seed: int, epoch: int = 0,
                     sample: float = 1e-3, shrink_window: bool = True, shuffle: bool = True,
                     drop_remainder: bool = True) -> Iterator[dict[str, np.ndarray]]:
    """One epoch of skip-gram batches (see skipgram_batch), max_labels = 2 * window.

    Randomness comes from (seed, epoch) alone: the subsampling draw, the window shrink of each centre
    (uniform in 1..window, as word2vec.c's `b = rand % window`), and the order of centres. Every surviving
    position is a centre once per epoch (the last partial batch is dropped unless drop_remainder=False, in
    which case it is smaller).
    """
    rng = np.random.default_rng([seed, epoch])
    tokens = subsample(corpus.tokens, keep_probabilities(corpus.counts, sample), rng)
    n = len(tokens)
    order = rng.permutation(n) if shuffle else np.arange(n)
    spans = rng.integers(1, window + 1, n) if shrink_window else np.full(n, window)
    steps = n // batch_size if drop_remainder else -(-n // batch_size)
    for i in range(steps):
        centres = order[i * batch_size:(i + 1) * batch_size]
        yield skipgram_batch(tokens, centres, spans[centres], window, corpus.vocab_size)


SOURCES = ("auto", "synthetic", "text")  # data.source values (module docstring)


def load_corpus(d: Any) -> Corpus:
    """The corpus a run's config.data names (fields source, dir, min_count, seed, num_train); its `source`
    says which it is. A data.dir that does not hold what data.source asks for is a DataError."""
    if d.source == "text":
        if not d.dir or not os.path.isfile(d.dir):
            raise DataError(f"data.source=text needs data.dir to be a text file (got {d.dir!r})")
        corpus = read_text8(d.dir, d.min_count, letters_only=True)
        return dataclasses.replace(corpus, source=f"{d.dir} (plain text; words: lowercase a-z runs, "
                                                  f"min_count {d.min_count})")
    if d.dir and d.source == "auto":
        path = Path(d.dir) / "text8"
        if not path.is_file():
            raise DataError(f"data.dir={d.dir}: no text8 file (looked for {path}; any other text file: "
                            f"data.source=text with data.dir=FILE)")
        return read_text8(path, d.min_count)
    sizes = {"num_tokens": d.num_train} if d.num_train else {}
    return synthetic_corpus(seed=d.seed, **sizes)


class _StaticEval:
    """A fixed evaluation set held as one array set, cut into `ordered` batches like XCBatcher's."""

    def __init__(self, batch: dict[str, np.ndarray], num_features: int, num_labels: int):
        self.batch, self.num_features, self.num_labels = batch, num_features, num_labels

    def ordered(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, len(self.batch["labels"]), batch_size):
            part = {k: v[start:start + batch_size] for k, v in self.batch.items()}
            yield pad_batch(part, batch_size, self.num_features, self.num_labels)


@register("text8", kind="labels", sources=SOURCES)
def label_data(config: Any) -> LabelData:
    """word2vec skip-gram on a corpus (load_corpus: text8, any text file, or the synthetic corpus) as a
    "labels" data set: the input is the centre word, the labels its context words. The last 5% of the corpus
    is held out, never trained on: fixed samples of its pairs are the evaluation subset (eval.subset centres)
    and the test set (eval.final_points; 0: every held-out centre).
    A corpus too short for one training batch and a held-out window is a DataError."""
    d = config.data
    corpus = load_corpus(d)
    cut = int(len(corpus.tokens) * 0.95)
    if cut < config.train.batch_size or len(corpus.tokens) - cut <= d.window:
        raise DataError(f"{d.dir if d.source == 'text' else corpus.source}: too few words: {len(corpus.tokens):,} kept in the vocabulary of "
                        f"{corpus.vocab_size:,}; the first 95% must fill a batch (train.batch_size="
                        f"{config.train.batch_size}) and the last 5% exceed the window (data.window={d.window})")
    train_corpus = dataclasses.replace(corpus, tokens=corpus.tokens[:cut])
    held_out = np.arange(cut, len(corpus.tokens) - d.window)

    def pairs(n: int) -> _StaticEval:
        """The pairs of n held-out centres (0, or n at least all of them: every one), a fixed draw of data.seed:
        the same n gives the same pairs, so the final test on eval.subset points is the evaluation subset."""
        centres = held_out
        if 0 < n < len(held_out):
            centres = np.sort(np.random.default_rng(d.seed).choice(held_out, size=n, replace=False))
        batch = skipgram_batch(corpus.tokens, centres, np.full(len(centres), d.window), d.window, corpus.vocab_size)
        return _StaticEval(batch, corpus.vocab_size, corpus.vocab_size)

    held = pairs(config.eval.subset)
    test = held if config.eval.final_points == config.eval.subset else pairs(config.eval.final_points)

    def endless():
        epoch = 0
        while True:
            empty = True
            for batch in skipgram_batches(train_corpus, config.train.batch_size, d.window, seed=config.seed,
                                          epoch=epoch, sample=d.subsample):
                empty = False
                yield batch
            if empty:   # subsampling left fewer words than a batch: never loop for ever
                raise DataError(f"{corpus.source}: epoch {epoch} kept fewer words than train.batch_size="
                                f"{config.train.batch_size} after subsampling (data.subsample={d.subsample})")
            epoch += 1

    # An epoch is one pass over the words that survive subsampling: their expected number, in batches.
    survivors = float(keep_probabilities(corpus.counts, d.subsample)[train_corpus.tokens].sum())
    return LabelData(source=corpus.source, num_features=corpus.vocab_size, num_labels=corpus.vocab_size,
                     num_train=cut, steps_per_epoch=max(int(survivors) // config.train.batch_size, 1), subset=held,
                     test=test, num_test=len(test.batch["labels"]),
                     details={"tokens": len(corpus.tokens), "vocab_size": corpus.vocab_size, "train_tokens": cut},
                     train_batches=endless, label_slots=2 * d.window)
