"""Extreme classification data: parser, cache, errors, synthetic generator, batches."""

import os

import numpy as np
import pytest
import scipy.sparse as sp

from hwrepro.data import xc
from hwrepro.errors import DataError

HAND = (
    "4 10 6\n"
    "0,5 1:0.5 3:2\n"
    " 2:1.25\n"                 # no labels
    "3 9:1e-2 0:-3.5  \n"        # exponent, negative value, trailing blanks
    "1,2,4 7:.5"                 # last line without a newline
)


@pytest.fixture(scope="module")
def tiny():
    return xc.synthetic("tiny", seed=0)


def _write(tmp_path, text, name="d.txt"):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(p)


def _assert_same(a, b):
    for k in ("feat_indptr", "feat_indices", "feat_values", "label_indptr", "label_indices"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    assert (a.num_features, a.num_labels) == (b.num_features, b.num_labels)


def test_hand_written_file_parses_to_expected_csr(tmp_path):
    d = xc.read_xc(_write(tmp_path, HAND), use_cache=False)
    assert (d.num_points, d.num_features, d.num_labels) == (4, 10, 6)
    np.testing.assert_array_equal(d.feat_indptr, [0, 2, 3, 5, 6])
    np.testing.assert_array_equal(d.feat_indices, [1, 3, 2, 9, 0, 7])
    np.testing.assert_array_equal(d.feat_values, np.float32([0.5, 2, 1.25, 0.01, -3.5, 0.5]))
    np.testing.assert_array_equal(d.label_indptr, [0, 2, 2, 3, 6])
    np.testing.assert_array_equal(d.label_indices, [0, 5, 3, 1, 2, 4])
    assert d.feat_indices.dtype == np.int32 and d.feat_values.dtype == np.float32
    assert d.source == str(tmp_path / "d.txt")


def test_an_empty_last_point_round_trips(tmp_path):
    path = _write(tmp_path, "3 5 4\n0 1:1\n1 2:1\n \n")  # write_xc's empty point: no labels, no features
    d = xc.read_xc(path, use_cache=False)
    assert d.num_points == 3 and d.labels_per_point().tolist() == [1, 1, 0]
    xc.write_xc(tmp_path / "again.txt", d)
    assert (tmp_path / "again.txt").read_text() == "3 5 4\n0 1:1\n1 2:1\n \n"


def test_writer_round_trips_exactly_and_blocks_stitch(tmp_path, tiny, monkeypatch):
    train, _ = tiny
    path = str(tmp_path / "t.txt")
    xc.write_xc(path, train)
    _assert_same(xc.read_xc(path, use_cache=False), train)
    # Tiny blocks: lines are split across reads and stitched back; the vectorised parser must agree with the
    # line-by-line reference on every block.
    monkeypatch.setattr(xc, "_BLOCK_BYTES", 1000)
    _assert_same(xc.read_xc(path, use_cache=False), train)
    block = open(path, "rb").read().split(b"\n", 1)[1]
    fast = xc._parse_block_fast(block, train.num_features, train.num_labels)
    slow = xc._parse_block_slow(block, path, 2, train.num_features, train.num_labels)
    for k in ("label_counts", "labels", "feat_counts", "feat_idx", "feat_val"):
        np.testing.assert_array_equal(getattr(fast, k), getattr(slow, k), err_msg=k)


def test_cache_round_trips_and_is_invalidated(tmp_path, monkeypatch):
    path = _write(tmp_path, HAND)
    first = xc.read_xc(path)
    assert os.path.exists(xc.cache_path(path))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]

    real_parse = xc._parse_file

    def must_not_parse(p):
        raise AssertionError("parsed although the cache is valid")

    monkeypatch.setattr(xc, "_parse_file", must_not_parse)
    _assert_same(xc.read_xc(path), first)

    # Same size, new content and mtime: the cache must not be used.
    monkeypatch.setattr(xc, "_parse_file", real_parse)
    changed = HAND.replace("1:0.5", "1:0.7")
    assert len(changed) == len(HAND)
    _write(tmp_path, changed)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    again = xc.read_xc(path)
    assert again.feat_values[0] == np.float32(0.7)
    _assert_same(xc.read_xc(path, use_cache=False), again)


def test_a_file_replaced_while_it_is_parsed_is_not_cached_under_the_old_fingerprint(tmp_path, monkeypatch):
    path = _write(tmp_path, HAND)
    real_parse = xc._parse_file
    changed = HAND.replace("1:0.5", "1:0.7")

    def replaced_first(p, *args, **kwargs):  # another process rewrites the file between hashing and parsing
        _write(tmp_path, changed)
        st = os.stat(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        return real_parse(p, *args, **kwargs)

    monkeypatch.setattr(xc, "_parse_file", replaced_first)
    assert xc.read_xc(path).feat_values[0] == np.float32(0.7)
    assert not os.path.exists(xc.cache_path(path))


def test_an_unreadable_file_or_a_folder_is_one_data_error(tmp_path, monkeypatch):
    path = _write(tmp_path, HAND)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(xc, "_cache_stamp", denied)  # the first read of the file's bytes
    with pytest.raises(DataError, match=r"^.*d\.txt: cannot read \(Permission denied\)$"):
        xc.read_xc(path)
    monkeypatch.setattr(xc, "_parse_file", denied)
    with pytest.raises(DataError, match="cannot read"):
        xc.read_xc(path, share=(0, 2))
    with pytest.raises(DataError, match="a folder, not a file of points"):
        xc.read_xc(tmp_path)


def test_unwritable_folder_skips_the_cache(tmp_path, monkeypatch):
    path = _write(tmp_path, HAND)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(xc.tempfile, "mkstemp", read_only)
    d = xc.read_xc(path)
    assert d.num_points == 4 and not os.path.exists(xc.cache_path(path))


ERRORS = [
    ("", 1, "empty file"),
    ("\n1 1:0.5\n", 1, "missing header"),
    ("1 10\n1 1:0.5\n", 1, "bad header"),
    ("a b c\n1 1:0.5\n", 1, "bad header"),
    ("2 10 5\n1 3:0.5\n2 4-0.5\n", 3, "bad feature token '4-0.5'"),
    ("2 10 5\n1 3:0.5\n2 4:0.5:1\n", 3, "bad feature token"),
    ("1 10 5\n1 3:abc\n", 2, "non-numeric feature value 'abc'"),
    ("1 10 5\n1 3:1.2.3\n", 2, "non-numeric feature value"),
    ("1 10 5\n1 10:0.5\n", 2, "feature index 10 >= number of features 10"),
    ("1 10 5\n5 1:0.5\n", 2, "label 5 >= number of labels 5"),
    ("1 10 5\n1 -1:0.5\n", 2, "negative feature index '-1'"),
    ("1 10 5\n-2 1:0.5\n", 2, "negative label '-2'"),
    ("1 10 5\n1,,2 1:0.5\n", 2, "bad label ''"),
    ("1 10 5\n1 x:0.5\n", 2, "bad feature index 'x'"),
    ("3 10 5\n1 1:0.5\n2 2:1\n", 4, "file ends after 2 points, the header says 3"),
    ("1 10 5\n1 1:0.5\n2 2:1\n", 3, "more points than the 1 the header says"),
    ("2 10 5\n1 1:0.5\n\n2 2:1\n", 4, "(a blank line between points is an empty point)"),
]


@pytest.mark.parametrize("text,line,problem", ERRORS, ids=[e[2][:30] for e in ERRORS])
def test_malformed_files_raise_data_error_naming_file_and_line(tmp_path, text, line, problem):
    path = _write(tmp_path, text)
    with pytest.raises(DataError) as err:
        xc.read_xc(path, use_cache=False)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: ") and problem in msg and "\n" not in msg
    assert isinstance(err.value, ValueError)


def test_error_line_number_is_right_in_a_later_block(tmp_path, monkeypatch):
    monkeypatch.setattr(xc, "_BLOCK_BYTES", 256)
    text = "301 10 5\n" + "1 1:0.5 2:0.25\n" * 250 + "1 1:0.5 2:zz\n" + "1 1:0.5\n" * 50
    path = _write(tmp_path, text)
    with pytest.raises(DataError, match=rf"^{path}:252: non-numeric feature value 'zz'$"):
        xc.read_xc(path, use_cache=False)


def test_trailing_blank_lines_are_tolerated(tmp_path):
    d = xc.read_xc(_write(tmp_path, "1 10 5\n1 1:0.5\n\n\n"), use_cache=False)
    assert d.num_points == 1


def test_find_split_files(tmp_path):
    assert xc.find_split_files(tmp_path, "amazon670k") is None
    assert xc.find_split_files(tmp_path / "missing", "amazon670k") is None
    amazon = tmp_path / "Amazon-670K"
    amazon.mkdir()
    (amazon / "train.txt").write_text("0 1 1\n")
    assert xc.find_split_files(tmp_path, "amazon670k") is None            # no test file yet
    (amazon / "test.txt").write_text("0 1 1\n")
    assert xc.find_split_files(tmp_path, "amazon670k") == (str(amazon / "train.txt"), str(amazon / "test.txt"))
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    (wiki / "wikiLSHTC_train.txt").write_text("0 1 1\n")
    (wiki / "wikiLSHTC_test.txt").write_text("0 1 1\n")
    assert xc.find_split_files(wiki, "wikilsh325k") == (str(wiki / "wikiLSHTC_train.txt"),
                                                         str(wiki / "wikiLSHTC_test.txt"))


def test_synthetic_is_deterministic_and_has_the_requested_shape(tiny):
    train, test = tiny
    again_train, again_test = xc.synthetic("tiny", seed=0)
    _assert_same(train, again_train)
    _assert_same(test, again_test)
    other, _ = xc.synthetic("tiny", seed=1)
    assert not np.array_equal(other.feat_indices[:100], train.feat_indices[:100])
    # The test split does not depend on how many training points were asked for.
    _, test_small = xc.synthetic("tiny", num_train=10, seed=0)
    _assert_same(test_small, test)

    shape = xc.SHAPES["tiny"]
    assert (train.num_points, test.num_points) == (shape.num_train, shape.num_test)
    assert (train.num_features, train.num_labels) == (shape.num_features, shape.num_labels)
    assert train.features_per_point().mean() == pytest.approx(shape.features_per_point, rel=0.05)
    assert train.labels_per_point().mean() == pytest.approx(shape.labels_per_point, rel=0.05)
    assert train.labels_per_point().min() >= 1 and train.features_per_point().min() >= 1
    # Valid CSR: ids in range, no duplicate feature or label within a point, positive unit-norm values.
    rows = np.repeat(np.arange(train.num_points), train.features_per_point())
    assert len(np.unique(rows * train.num_features + train.feat_indices)) == len(rows)
    assert train.feat_indices.max() < train.num_features and train.label_indices.max() < train.num_labels
    assert np.all(train.feat_values > 0)
    np.testing.assert_allclose(np.bincount(rows, train.feat_values.astype(np.float64) ** 2), 1.0, rtol=1e-5)
    assert "synthetic (seed 0, tiny shape, train)" == train.source


def test_synthetic_label_frequencies_are_heavy_tailed():
    shape = xc.XCShape("test", 5_000, 20_000, 20_000, 0, 10.0, 4.0)
    train, _ = xc.synthetic(shape, seed=3)
    counts = np.sort(train.label_counts())[::-1]
    top_share = counts[:200].sum() / counts.sum()                         # top 1% of labels
    assert top_share > 0.08                                                # uniform would give 0.01
    assert counts[0] > 30 * max(np.median(counts), 1)
    assert np.mean(counts <= 1) > 0.2                                      # a long tail seen once or never


def test_synthetic_structure_is_learnable(tiny):
    """A feature-label co-occurrence classifier fitted on train beats the popular-label guess on test."""
    train, test = tiny

    def matrices(d):
        x = sp.csr_matrix((d.feat_values, d.feat_indices, d.feat_indptr), shape=(d.num_points, d.num_features))
        y = sp.csr_matrix((np.ones(len(d.label_indices)), d.label_indices, d.label_indptr),
                          shape=(d.num_points, d.num_labels))
        return x, y

    x_tr, y_tr = matrices(train)
    x_te, y_te = matrices(test)
    freq = np.asarray(y_tr.sum(0)).ravel()
    w = (x_tr.T @ y_tr).toarray() / np.maximum(freq, 1)                   # mean feature vector per label
    top = np.asarray((x_te @ w).argmax(1)).ravel()
    p_at_1 = y_te[np.arange(test.num_points), top].mean()
    popular = y_te[:, freq.argmax()].mean()
    assert popular < 0.15
    assert p_at_1 > 0.5 and p_at_1 > 5 * popular


def test_batches_have_contract_shapes_padding_and_cover_each_point_once(tiny):
    train, _ = tiny
    b_size, max_f, max_l = 64, 40, 4
    batcher = xc.XCBatcher(train, max_f, max_l)
    seen = []
    for batch in batcher.epoch(b_size, seed=7, epoch=0):
        assert set(batch) == {"feat_ids", "feat_vals", "labels"}
        assert batch["feat_ids"].shape == (b_size, max_f) and batch["feat_ids"].dtype == np.int32
        assert batch["feat_vals"].shape == (b_size, max_f) and batch["feat_vals"].dtype == np.float32
        assert batch["labels"].shape == (b_size, max_l) and batch["labels"].dtype == np.int32
        pad = batch["feat_ids"] == train.num_features
        assert np.all(batch["feat_vals"][pad] == 0) and np.all(batch["feat_vals"][~pad] > 0)
        seen.append(batch)
    assert len(seen) == train.num_points // b_size
    # Identify each batch row with its point by its first label and features: every point at most once.
    keys = [tuple(r) for b in seen for r in np.concatenate([b["labels"], b["feat_ids"]], 1)]
    assert len(set(keys)) == len(keys) == len(seen) * b_size

    # A fresh permutation per epoch, reproducible from (seed, epoch).
    first = next(batcher.epoch(b_size, seed=7, epoch=0))["feat_ids"]
    np.testing.assert_array_equal(first, seen[0]["feat_ids"])
    assert not np.array_equal(next(batcher.epoch(b_size, seed=7, epoch=1))["feat_ids"], first)
    endless = batcher.epochs(b_size, seed=7)
    steps = batcher.steps_per_epoch(b_size)
    for _ in range(steps):
        next(endless)
    np.testing.assert_array_equal(next(endless)["feat_ids"],
                                  next(batcher.epoch(b_size, seed=7, epoch=1))["feat_ids"])


def test_batch_rows_match_the_csr_and_truncation_keeps_largest(tmp_path):
    d = xc.read_xc(_write(tmp_path, "2 10 6\n0,1,2,3 1:0.1 2:0.9 3:0.5 4:0.7\n5 6:1\n"), use_cache=False)
    batcher = xc.XCBatcher(d, max_features=2, max_labels=3)
    assert batcher.truncation == xc.Truncation(points_over_features=1, features_dropped=2,
                                                points_over_labels=1, labels_dropped=1)
    b = batcher.batch(np.array([0, 1]))
    np.testing.assert_array_equal(b["feat_ids"], [[2, 4], [6, 10]])
    np.testing.assert_array_equal(b["feat_vals"], np.float32([[0.9, 0.7], [1, 0]]))
    np.testing.assert_array_equal(b["labels"], [[0, 1, 2], [5, 6, 6]])
    # The data set itself is not reordered.
    np.testing.assert_array_equal(d.feat_indices[:4], [1, 2, 3, 4])


def test_ordered_batches_cover_every_point_once_with_a_mask(tiny):
    _, test = tiny
    batcher = xc.XCBatcher(test, 64, 8)
    batches = list(batcher.ordered(300))
    assert len(batches) == 4                                               # 1000 points: 300+300+300+100
    assert all(b["feat_ids"].shape == (300, 64) and b["mask"].shape == (300,) for b in batches)
    assert sum(int(b["mask"].sum()) for b in batches) == test.num_points
    last = batches[-1]
    assert np.all(last["mask"][:100]) and not np.any(last["mask"][100:])
    assert np.all(last["feat_ids"][100:] == test.num_features) and np.all(last["labels"][100:] == test.num_labels)
    full = batcher.batch(np.arange(test.num_points))
    np.testing.assert_array_equal(np.concatenate([b["labels"][b["mask"]] for b in batches]), full["labels"])


def test_fixed_subset_is_a_fixed_shuffled_subset(tiny):
    _, test = tiny
    sub = xc.fixed_subset(test, 100, seed=5)
    assert sub.num_points == 100
    _assert_same(sub, xc.fixed_subset(test, 100, seed=5))
    rows = np.random.default_rng(5).permutation(test.num_points)[:100]
    assert not np.array_equal(rows, np.sort(rows))
    np.testing.assert_array_equal(sub.labels_per_point(), test.labels_per_point()[rows])
    for i in (0, 57, 99):
        r = rows[i]
        np.testing.assert_array_equal(sub.feat_indices[sub.feat_indptr[i]:sub.feat_indptr[i + 1]],
                                      test.feat_indices[test.feat_indptr[r]:test.feat_indptr[r + 1]])
    assert xc.fixed_subset(test, 10**6, seed=5).num_points == test.num_points   # clamps, no crash


def test_each_process_reads_its_share_and_batches_are_the_whole_splits(tmp_path, monkeypatch):
    """Process i of n keeps the points i, i + n, ... of a file (block by block); batches of the shares, merged
    over the processes (here: the shares' own partial batches added up), are the batches of the whole file,
    also for a shuffled evaluation subset."""
    from hwrepro.harness import parallel

    train, _ = xc.synthetic("tiny", num_train=50, num_test=10, seed=3)
    path = tmp_path / "train.txt"
    xc.write_xc(path, train)
    whole = xc.read_xc(path, use_cache=False)
    shares = [xc.read_xc(path, share=(i, 3)) for i in range(3)]
    assert [s.num_points for s in shares] == [17, 17, 16] and not list(tmp_path.glob("*.npz"))
    np.testing.assert_array_equal(shares[1].feat_values, whole.take(np.arange(1, 50, 3)).feat_values)
    one = xc.XCBatcher(whole, 8, 4).batch(np.arange(5))
    one["feat_vals"][0, 0] = -0.0
    merged = parallel.merge_over_processes(one)  # one process: its own batch, bits and dtypes kept
    assert all(merged[k].dtype == one[k].dtype and merged[k].tobytes() == one[k].tobytes() for k in one)
    parts = []
    monkeypatch.setattr(parallel, "merge_over_processes", lambda b: parts.append(b) or b)
    rows = np.random.default_rng(0).permutation(50)[:12]
    for rows_of, pick in ((lambda d: d, rows), (lambda d: xc.fixed_subset(d, 20, seed=1), rows[:8] % 20)):
        parts.clear()
        for share in shares:
            xc.XCBatcher(rows_of(share), 8, 4).batch(pick)
        summed = {k: sum(p[k] for p in parts) for k in parts[0]}
        want = xc.XCBatcher(rows_of(whole), 8, 4).batch(pick)
        assert all(np.array_equal(summed[k], want[k]) for k in want)
    assert xc.XCBatcher(shares[2], 8, 4).steps_per_epoch(10) == 5


def test_evaluation_batches_keep_every_label_of_a_point(tmp_path):
    """Training cuts a point's labels to data.max_labels; evaluation must not (a correct prediction of a cut
    label would count as a miss), and the run's details say what training and evaluation cut."""
    import ml_collections

    train = xc.read_xc(_write(tmp_path, "2 10 6\n0,1,2,3 1:1\n4 2:1\n", "train.txt"), use_cache=False)
    test = xc.read_xc(_write(tmp_path, "2 10 6\n0,1,2,3,4 1:1\n5 2:1\n", "test.txt"), use_cache=False)
    config = ml_collections.ConfigDict({"data": {"max_features": 4, "max_labels": 2, "seed": 0},
                                        "train": {"batch_size": 1}, "eval": {"final_points": 0, "subset": 2},
                                        "seed": 0})
    data = xc.label_data(train, test, config)
    (batch,) = data.test.ordered(2)
    assert batch["labels"].tolist() == [[0, 1, 2, 3, 4], [5, 6, 6, 6, 6]]
    assert data.details["truncation_train"]["labels_dropped"] == 2
    assert data.details["truncation_test"]["labels_dropped"] == 0
    assert next(data.train_batches())["labels"].shape == (1, 2)
