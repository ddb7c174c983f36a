"""Text8 / word2vec data: vocabulary, subsampling, skip-gram windows, reader errors, synthetic corpus."""

import gzip
import re

import numpy as np
import pytest

from hwrepro.data import text8 as t8
from hwrepro.errors import ConfigError, DataError

TEXT = "the cat sat on\nthe mat  the end\n"
# Counts: the 3, every other word 1. Vocabulary order: decreasing count, ties alphabetical.
WORDS = ("the", "cat", "end", "mat", "on", "sat")
IDS = [0, 1, 5, 4, 0, 3, 0, 2]


@pytest.fixture(scope="module")
def corpus():
    return t8.synthetic_corpus(num_tokens=200_000, vocab_size=2_000, num_topics=20, seed=0)


def _write(tmp_path, data):
    p = tmp_path / "text8"
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def test_vocabulary_of_a_hand_worked_corpus(tmp_path):
    path = _write(tmp_path, TEXT)
    c = t8.read_text8(path, min_count=1)
    assert c.words == WORDS
    np.testing.assert_array_equal(c.tokens, IDS)
    np.testing.assert_array_equal(c.counts, [3, 1, 1, 1, 1, 1])
    assert c.tokens.dtype == np.int32 and c.unk is None and c.dropped == 0 and c.source == path

    dropped = t8.read_text8(path, min_count=2)                     # rare words leave the text
    assert dropped.words == ("the",) and dropped.dropped == 5
    np.testing.assert_array_equal(dropped.tokens, [0, 0, 0])

    unk = t8.read_text8(path, min_count=2, rare="unk")             # or become UNK, id 0
    assert unk.words == ("<unk>", "the") and unk.unk == 0 and unk.dropped == 0
    np.testing.assert_array_equal(unk.tokens, [1, 0, 0, 0, 1, 0, 1, 0])
    np.testing.assert_array_equal(unk.counts, [5, 3])

    capped = t8.read_text8(path, min_count=1, max_vocab=3)
    assert capped.words == ("the", "cat", "end")
    np.testing.assert_array_equal(capped.tokens, [0, 1, 0, 0, 2])
    capped_unk = t8.read_text8(path, min_count=1, max_vocab=3, rare="unk")  # UNK takes one of the 3 slots
    assert capped_unk.words == ("<unk>", "the", "cat")


def test_reading_in_small_blocks_gives_the_same_corpus(tmp_path, monkeypatch, corpus):
    text = " ".join(np.array(corpus.words)[corpus.tokens[:20_000]]) + "\n"
    path = _write(tmp_path, text)
    whole = t8.read_text8(path, min_count=1)
    monkeypatch.setattr(t8, "_BLOCK_BYTES", 37)                   # words cut across reads
    pieces = t8.read_text8(path, min_count=1)
    assert whole.words == pieces.words
    np.testing.assert_array_equal(whole.tokens, pieces.tokens)
    # Same text, same vocabulary as the generator built (both sort by count, then alphabetically).
    assert len(whole.tokens) == 20_000
    np.testing.assert_array_equal(np.array(whole.words)[whole.tokens], np.array(corpus.words)[corpus.tokens[:20_000]])


@pytest.mark.parametrize("data,line,problem", [
    (b"", 1, "empty file: no words"),
    (b" \n\n  ", 1, "empty file: no words"),
    (b"some words\nmore\x00words", 2, "not a text file: NUL byte at byte offset 15"),
    (b"ok ok\nok\n caf\xc3\xa9 \xff\xfe", 3, "not UTF-8 text at byte offset 16"),
])
def test_bad_files_raise_data_error_with_position(tmp_path, monkeypatch, data, line, problem):
    monkeypatch.setattr(t8, "_BLOCK_BYTES", 4)                    # positions must survive block boundaries
    path = _write(tmp_path, data)
    with pytest.raises(DataError) as err:
        t8.read_text8(path)
    assert str(err.value).startswith(f"{path}:{line}: {problem}")


def test_subsampling_probabilities_hand_worked_and_empirical():
    counts = np.array([3, 1, 1, 1, 1, 1])
    keep = t8.keep_probabilities(counts, sample=0.1)
    # f = 3/8: (sqrt(3.75) + 1) * 0.1 / 0.375; f = 1/8: (sqrt(1.25) + 1) * 0.8 > 1, capped.
    np.testing.assert_allclose(keep, [(np.sqrt(3.75) + 1) * 0.1 / 0.375, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(t8.keep_probabilities(counts, 0.0), np.ones(6))

    tokens = np.zeros(100_000, dtype=np.int32)
    kept = t8.subsample(tokens, keep, np.random.default_rng(0))
    sd = np.sqrt(keep[0] * (1 - keep[0]) / len(tokens))
    assert abs(len(kept) / len(tokens) - keep[0]) < 5 * sd


def test_skipgram_windows_hand_worked():
    tokens = np.array(IDS, dtype=np.int32)                         # the cat sat on the mat the end
    b = t8.skipgram_batch(tokens, centres=np.array([1, 4, 6, 5, 0]), spans=np.array([2, 1, 2, 2, 1]),
                          window=2, vocab_size=6)
    np.testing.assert_array_equal(b["feat_ids"], [[1], [0], [0], [3], [0]])
    np.testing.assert_array_equal(b["feat_vals"], np.ones((5, 1), np.float32))
    np.testing.assert_array_equal(b["labels"], [
        [0, 4, 5, 6],      # cat, span 2: the, sat, on
        [3, 4, 6, 6],      # the (pos 4), span 1: on, mat
        [0, 2, 3, 6],      # the (pos 6), span 2: the, mat, end (text ends)
        [0, 2, 4, 6],      # mat, span 2: on, the, the (merged), end
        [1, 6, 6, 6],      # the (pos 0), span 1: cat (text starts)
    ])
    assert b["labels"].dtype == np.int32 and b["feat_ids"].dtype == np.int32


def test_epoch_uses_every_position_once_with_shrunk_windows(corpus):
    window, bs = 3, 500
    batches = list(t8.skipgram_batches(corpus, bs, window, seed=1, sample=0.0, drop_remainder=False))
    centres = np.concatenate([b["feat_ids"][:, 0] for b in batches])
    np.testing.assert_array_equal(np.sort(centres), np.sort(corpus.tokens))
    assert all(b["labels"].shape[1] == 2 * window for b in batches[:-1])
    n_ctx = np.concatenate([(b["labels"] < corpus.vocab_size).sum(1) for b in batches])
    assert n_ctx.min() >= 1 and n_ctx.max() <= 2 * window
    assert np.mean(n_ctx <= 2) > 0.2                               # spans of 1 happen (about a third)

    again = next(t8.skipgram_batches(corpus, bs, window, seed=1, sample=0.0))
    np.testing.assert_array_equal(again["labels"], batches[0]["labels"])
    other = next(t8.skipgram_batches(corpus, bs, window, seed=1, epoch=1, sample=0.0))
    assert not np.array_equal(other["feat_ids"], batches[0]["feat_ids"])

    sub = list(t8.skipgram_batches(corpus, bs, window, seed=1, sample=1e-3))
    frequent = np.mean(np.concatenate([b["feat_ids"][:, 0] for b in sub]) == 0)
    assert frequent < np.mean(corpus.tokens == 0)                  # the commonest word is thinned out


def test_synthetic_corpus_is_deterministic_and_zipfian(corpus):
    again = t8.synthetic_corpus(num_tokens=200_000, vocab_size=2_000, num_topics=20, seed=0)
    np.testing.assert_array_equal(again.tokens, corpus.tokens)
    assert again.words == corpus.words
    other = t8.synthetic_corpus(num_tokens=200_000, vocab_size=2_000, num_topics=20, seed=1)
    assert not np.array_equal(other.tokens[:1000], corpus.tokens[:1000])
    assert len(corpus.tokens) == 200_000 and corpus.vocab_size > 1_500
    assert np.all(np.diff(corpus.counts) <= 0)
    assert corpus.counts[:20].sum() / corpus.counts.sum() > 0.2    # top 1% of words: a fifth of the text
    ranks = np.arange(1, corpus.vocab_size + 1)
    slope = np.polyfit(np.log(ranks[5:500]), np.log(corpus.counts[5:500]), 1)[0]
    assert -1.4 < slope < -0.5


def test_synthetic_contexts_are_predictable(corpus):
    """Held-out context words are far more likely under a co-occurrence model than under word frequencies."""
    v = corpus.vocab_size
    split = len(corpus.tokens) * 4 // 5
    train = t8.Corpus(corpus.tokens[:split], corpus.words, corpus.counts, None, 0, "train")
    test = t8.Corpus(corpus.tokens[split:], corpus.words, corpus.counts, None, 0, "test")

    def pairs(c):
        b = t8.skipgram_batch(c.tokens, np.arange(len(c.tokens)), np.full(len(c.tokens), 2), 2, v)
        centre = np.repeat(b["feat_ids"][:, 0], b["labels"].shape[1])
        ctx = b["labels"].ravel()
        return centre[ctx < v], ctx[ctx < v]

    c_tr, x_tr = pairs(train)
    cooc = np.bincount(c_tr * v + x_tr, minlength=v * v).reshape(v, v) + 0.1
    unigram = np.bincount(x_tr, minlength=v) + 0.1
    c_te, x_te = pairs(test)
    nll_cooc = -np.mean(np.log(cooc[c_te, x_te] / cooc.sum(1)[c_te]))
    nll_unigram = -np.mean(np.log(unigram[x_te] / unigram.sum()))
    assert nll_unigram - nll_cooc > 0.5


# --- any plain-text file as a corpus (data.source=text) ----------------------------------------------------

PROSE = "The Cat, the cat's HAT!\n3 cats: the caf\xe9 (1913).\n"
# letters_only: lowercase a-z runs, everything else a break (digits and 'é' too, so "café" -> "caf").
PROSE_WORDS = ["the", "cat", "the", "cat", "s", "hat", "cats", "the", "caf"]


def _text_config(path, min_count=1, batch_size=2, window=1):
    from configs.slide_text8 import get_config

    c = get_config()
    c.data.source, c.data.dir, c.data.min_count, c.data.window = "text", str(path), min_count, window
    c.train.batch_size = batch_size
    c.eval.subset = c.eval.final_points = 8
    return c


@pytest.mark.parametrize("encode", [lambda t: t.encode("utf-8"), lambda t: t.encode("cp1252"),
                                    lambda t: gzip.compress(t.encode("utf-8"))])
def test_a_text_file_is_tokenised_as_text8_whatever_its_encoding_or_compression(tmp_path, monkeypatch, encode):
    path = tmp_path / "prose.txt.gz"                               # the name does not matter: gzip by content
    path.write_bytes(encode(PROSE))
    monkeypatch.setattr(t8, "_BLOCK_BYTES", 5)                    # words cut across reads
    c = t8.read_text8(path, min_count=1, letters_only=True)
    assert c.words == ("the", "cat", "caf", "cats", "hat", "s")   # by count, then alphabetical
    np.testing.assert_array_equal(np.array(c.words)[c.tokens], PROSE_WORDS)


def test_text_source_loads_a_file_through_the_config(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(" ".join(["alpha beta gamma beta"] * 30))
    data = t8.label_data(_text_config(path, min_count=2))
    assert data.source.startswith(f"{path} (plain text") and data.num_labels == 3
    assert data.details["tokens"] == 120 and data.details["train_tokens"] == 114
    batch = next(data.train_batches())
    assert batch["feat_ids"].shape == (2, 1) and batch["labels"].shape == (2, 2)
    # An epoch is the batches of the words subsampling keeps: with three words each a third or more of the
    # text, word2vec's rule (t = 1e-3) keeps about 5% of them, not the 114 training words.
    c = _text_config(path, min_count=2)
    keep = t8.keep_probabilities(np.array([60, 30, 30]), c.data.subsample)
    assert data.steps_per_epoch == int(57 * keep[0] + 28.5 * keep[1] + 28.5 * keep[2]) // 2 < 114 // 2


def test_held_out_tail_is_the_test_set_and_each_epoch_draws_anew(tmp_path):
    """The test pairs' centres lie in the held-out last 5% (words found only there), and the training batches
    go on into epoch 1's own subsample and shuffle, not epoch 0's again."""
    import dataclasses

    path = tmp_path / "book.txt"
    path.write_text(" ".join(["alpha beta gamma delta"] * 95 + ["omega psi"] * 10))
    c = _text_config(path, min_count=2)
    c.data.subsample = 1.0  # keep most words: an epoch of many batches
    data = t8.label_data(c)
    corpus = t8.load_corpus(c.data)
    tail = {corpus.words.index("omega"), corpus.words.index("psi")}
    assert set(data.test.batch["feat_ids"][:, 0].tolist()) == tail
    train = dataclasses.replace(corpus, tokens=corpus.tokens[:data.num_train])
    epochs = [list(t8.skipgram_batches(train, 2, 1, seed=c.seed, epoch=e, sample=1.0)) for e in (0, 1)]
    stream = data.train_batches()
    for want in epochs[0] + epochs[1][:1]:
        got = next(stream)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    assert not all(np.array_equal(epochs[0][0][k], epochs[1][0][k]) for k in epochs[0][0])


def test_final_points_sets_the_held_out_pairs_of_the_test_and_the_example_width_follows_the_window(tmp_path):
    """eval.final_points and data.window reach a text8 run (they were ignored): the test set is that many
    held-out centres (0: all, the subset's own draw when equal), and data.max_labels follows the window; a
    width that contradicts the window is refused by field."""
    from hwrepro.experiments import slide

    path = tmp_path / "book.txt"
    path.write_text(" ".join(["alpha beta gamma delta"] * 100))
    c = _text_config(path, window=2)
    assert c.data.max_labels == 4 and c.eval.final_points == 8
    slide.validate(c)
    data = t8.label_data(c)
    assert data.test is data.subset and data.num_test == 8 and data.test.batch["labels"].shape == (8, 4)
    c.eval.final_points = 3
    data = t8.label_data(c)
    assert data.num_test == 3 and len(data.test.batch["feat_ids"]) == 3 and len(data.subset.batch["feat_ids"]) == 8
    c.eval.final_points = 0                            # every held-out centre: 400 words, the last 20, window 2
    assert t8.label_data(c).num_test == 400 - 380 - 2
    for field, value, message in (("max_labels", 10, "data.max_labels=10: a text8 example has 2 * data.window = 4"),
                                  ("max_features", 2, "data.max_features=2: a text8 example has 1 feature")):
        bad = _text_config(path, window=2)
        bad.data[field] = value
        with pytest.raises(ConfigError, match=re.escape(message)):
            slide.validate(bad)


@pytest.mark.parametrize("data,problem", [
    (b"", ":1: empty file: no words"),
    (b"1913 -- 42\n", ":1: empty file: no words (no letters a-z)"),
    (b"text then\n\x00\x01binary", ":2: not a text file: NUL byte at byte offset 10"),
    (gzip.compress(b"some words " * 100, mtime=0)[:-30], ":1: broken gzip data after byte offset 0"),
    (b"every word here is different", ": too few words for a vocabulary: none of its 5 distinct words occurs 2"),
])
def test_bad_text_files_are_one_line_naming_file_and_problem(tmp_path, data, problem):
    path = tmp_path / "corpus"
    path.write_bytes(data)
    with pytest.raises(DataError) as err:
        t8.label_data(_text_config(path, min_count=2))
    assert str(err.value).startswith(f"{path}{problem}"), str(err.value)


def test_a_text_too_short_to_train_on_and_a_missing_file_are_data_errors(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("one two one two one two")
    with pytest.raises(DataError, match=rf"^{path}: too few words: 6 kept .*train.batch_size=128"):
        t8.label_data(_text_config(path, batch_size=128))
    path.write_text("word " * 40)                                  # subsampling keeps ~1 of the 38 training words
    with pytest.raises(DataError, match=rf"^{path} \(plain text.*: epoch 0 kept fewer words than train.batch_size=30"):
        next(t8.label_data(_text_config(path, batch_size=30)).train_batches())
    with pytest.raises(DataError, match="data.source=text needs data.dir to be a text file"):
        t8.label_data(_text_config(tmp_path / "absent.txt"))
    with pytest.raises(DataError, match="no text8 file .* data.source=text"):
        c = _text_config(tmp_path)
        c.data.source = "auto"
        t8.label_data(c)


def test_text_source_is_checked_against_the_data_set_before_a_run(tmp_path):
    from hwrepro.errors import ConfigError
    from hwrepro.experiments import slide

    slide.validate(_text_config(tmp_path / "any.txt"))            # text8 reads plain text
    c = _text_config(tmp_path / "any.txt")
    c.data.dataset = "tiny"
    with pytest.raises(ConfigError, match="data.source='text' is not one of 'auto', 'synthetic' for data.dataset='tiny'"):
        slide.validate(c)
