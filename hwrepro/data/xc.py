"""Extreme classification data (Amazon-670K, WikiLSH-325K): reader, cache, synthetic stand-ins, batches.

File format (the Extreme Classification Repository's): a header line `points features labels`, then one line
per point, `l1,l2,... f:v f:v ...`. The label list may be empty, in which case the line starts with a space.

Everything is numpy and CSR: a data set of half a million points with ~75 features each is ~37M non-zeros,
so no per-point Python objects are ever built. Batches are fixed-shape dicts in the shared batch format:

  feat_ids  int32   [B, max_features]  padding = num_features
  feat_vals float32 [B, max_features]  padding = 0
  labels    int32   [B, max_labels]    padding = num_labels (evaluation batches: as wide as the split's
                                       widest point, so no label is cut: evaluation_label_width)
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import os
import re
import tempfile
from typing import Any, Callable, Iterator

import numpy as np

from hwrepro.data import register
from hwrepro.errors import ConfigError, DataError

_BLOCK_BYTES = 1 << 23        # the parser works on ~8 MiB of whole lines at a time (bounded temporaries)
_CACHE_SUFFIX = ".hwrepro.npz"
_CACHE_VERSION = 2            # bump when the parse result or the cache layout changes

# --------------------------------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True, eq=False)
class Share:
    """The points of a split that this process holds when the processes of a run read it together.

    owned: bool [points of the whole split]; row j of the process's XCData is its j-th owned point. Batches
    are drawn over the whole split in every process; each process fills the rows it owns and leaves zeros in
    the others', and hwrepro.harness.parallel.merge_over_processes gives every process the whole batch, bit
    for bit the one-process batch.
    """

    owned: np.ndarray

    @classmethod
    def modulo(cls, index: int, count: int, num_points: int) -> Share:
        """Process `index` of `count`: the points i with i % count == index."""
        return cls(np.arange(num_points) % count == index)

    @property
    def num_points(self) -> int:
        return len(self.owned)

    @functools.cached_property
    def local(self) -> np.ndarray:
        """int64 [num_points]: each owned point's row here (-1 for another process's point)."""
        return np.where(self.owned, np.cumsum(self.owned) - 1, -1)

    def subset(self, rows: np.ndarray) -> tuple[np.ndarray, Share]:
        """For the points `rows` of the whole split: (the local rows of those owned here, the subset's Share)."""
        mine = self.owned[rows]
        return self.local[rows[mine]], Share(mine)


@dataclasses.dataclass(frozen=True, eq=False)
class XCData:
    """One split of an extreme classification data set, features and labels in CSR form.

    Row i's features are feat_indices/feat_values[feat_indptr[i]:feat_indptr[i+1]], in file order; its labels
    are label_indices[label_indptr[i]:label_indptr[i+1]]. `source` says where the data came from (a path or
    the synthetic generator and its seed) so a run record can never confuse the two.
    """

    feat_indptr: np.ndarray    # int64 [N+1]
    feat_indices: np.ndarray   # int32 [nnz]
    feat_values: np.ndarray    # float32 [nnz]
    label_indptr: np.ndarray   # int64 [N+1]
    label_indices: np.ndarray  # int32 [nnz_labels]
    num_features: int
    num_labels: int
    source: str
    share: Share | None = None  # this process's part of a split read by several processes (else all of it)

    @property
    def num_points(self) -> int:
        """The points held here (all of the split's, or this process's share of them)."""
        return len(self.feat_indptr) - 1

    def features_per_point(self) -> np.ndarray:
        """int64 [N]: number of non-zero features of each point."""
        return np.diff(self.feat_indptr)

    def labels_per_point(self) -> np.ndarray:
        """int64 [N]: number of labels of each point."""
        return np.diff(self.label_indptr)

    def label_counts(self) -> np.ndarray:
        """int64 [num_labels]: how many points carry each label (its frequency)."""
        return np.bincount(self.label_indices, minlength=self.num_labels)

    def take(self, rows: np.ndarray, source: str | None = None) -> XCData:
        """The points `rows` (int [M], any order, repeats allowed) as a new XCData."""
        rows = np.asarray(rows, dtype=np.int64)
        f_ptr, f_pos = _gather_rows(self.feat_indptr, rows)
        l_ptr, l_pos = _gather_rows(self.label_indptr, rows)
        return XCData(f_ptr, self.feat_indices[f_pos], self.feat_values[f_pos], l_ptr,
                      self.label_indices[l_pos], self.num_features, self.num_labels,
                      self.source if source is None else source)


def _gather_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR row gather: (new indptr [M+1], positions [nnz'] into the old arrays), without a loop over rows."""
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    new_ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    # Position k of the output lies in output row r(k): old position = starts[r] + (k - new_ptr[r]).
    pos = np.repeat(starts - new_ptr[:-1], lens) + np.arange(new_ptr[-1], dtype=np.int64)
    return new_ptr, pos


def _csr(counts: np.ndarray) -> np.ndarray:
    """int64 [N+1] indptr from per-row counts [N]."""
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


# ------------------------------------------------------------------------------------------------ parsing

# Byte classes for the vectorised parser: 0 not allowed, 1 blank, 2 newline, 3 digit, 4 ':', 5 ',',
# 6 a character that may appear only inside a feature value (sign, decimal point, exponent).
_CLASS = np.zeros(256, dtype=np.uint8)
_CLASS[[ord(" "), ord("\t"), ord("\r")]] = 1
_CLASS[ord("\n")] = 2
_CLASS[ord("0"):ord("9") + 1] = 3
_CLASS[ord(":")] = 4
_CLASS[ord(",")] = 5
_CLASS[[ord(c) for c in ".+-eE"]] = 6
_TO_BLANKS = bytes.maketrans(b":,", b"  ")
_VALUE_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclasses.dataclass
class _Block:
    """Parse result of a run of whole lines."""

    label_counts: np.ndarray  # int64 [lines]
    labels: np.ndarray        # int64 [sum label_counts]
    feat_counts: np.ndarray   # int64 [lines]
    feat_idx: np.ndarray      # int64 [sum feat_counts]
    feat_val: np.ndarray      # float32 [sum feat_counts]


def _parse_block_fast(block: bytes, num_features: int, num_labels: int) -> _Block | None:
    """Parses whole lines (block ends with b'\\n') with numpy only; None if anything looks wrong.

    Token structure (which characters form a label list, a feature index, a value) is checked on byte
    classes and prefix sums; the numbers themselves are read in one C call (np.fromstring) after turning ':'
    and ',' into blanks. Any doubt returns None and the caller re-parses the block line by line, which
    finds and names the faulty line.
    """
    a = np.frombuffer(block, dtype=np.uint8)
    cls = _CLASS[a]
    if not cls.all():
        return None
    newlines = np.flatnonzero(a == ord("\n"))
    blank = cls < 3
    starts = np.flatnonzero(blank[:-1] & ~blank[1:]) + 1      # token = bytes [start, end)
    if not blank[0]:
        starts = np.concatenate([[0], starts])
    ends = np.flatnonzero(~blank[:-1] & blank[1:]) + 1         # the block ends with a newline: every token ends
    tok_line = np.searchsorted(newlines, starts)               # line k holds the bytes up to newlines[k]

    # Separators counted per token by binary search on their positions (cheaper than byte-wise prefix sums).
    colon_at = np.flatnonzero(a == ord(":"))
    comma_at = np.flatnonzero(a == ord(","))
    first_colon = np.searchsorted(colon_at, starts)
    colons = np.searchsorted(colon_at, ends) - first_colon
    commas = np.searchsorted(comma_at, ends) - np.searchsorted(comma_at, starts)
    first_of_line = np.ones(len(starts), dtype=bool)
    first_of_line[1:] = tok_line[1:] != tok_line[:-1]
    is_label = first_of_line & (colons == 0)

    # Label lists: digits and single commas, no comma at either end.
    if np.any(np.diff(comma_at) == 1):
        return None
    lab_s, lab_e = starts[is_label], ends[is_label]
    if np.any(a[lab_s] == ord(",")) or np.any(a[lab_e - 1] == ord(",")):
        return None
    # Features: exactly one colon, inside the token, no comma.
    feat = ~is_label
    if np.any(colons[feat] != 1) or np.any(commas[feat] != 0):
        return None
    colon_pos = colon_at[first_colon[feat]]
    if np.any(colon_pos == starts[feat]) or np.any(colon_pos == ends[feat] - 1):
        return None
    # Sign, '.', 'e' only after a feature's colon (labels and indices are plain non-negative integers).
    special = np.flatnonzero(cls == 6)
    if len(special):
        tok = np.searchsorted(starts, special, side="right") - 1
        feat_rank = np.cumsum(feat) - 1                        # token -> its index among feature tokens
        if np.any(is_label[tok]) or np.any(special <= colon_pos[feat_rank[tok]]):
            return None

    per_token = np.where(is_label, commas + 1, 2)
    expected = int(per_token.sum())
    if expected:
        try:
            numbers = np.fromstring(block.translate(_TO_BLANKS), dtype=np.float64, sep=" ")
        except ValueError:
            return None
        if len(numbers) != expected:
            return None
    else:
        numbers = np.zeros(0)
    from_label = np.repeat(is_label, per_token)
    labels = numbers[from_label]
    pairs = numbers[~from_label].reshape(-1, 2)
    if (np.any(labels >= num_labels) or np.any(pairs[:, 0] >= num_features)
            or not np.all(np.isfinite(pairs[:, 1]))):
        return None
    values = pairs[:, 1].astype(np.float32)
    if not np.all(np.isfinite(values)):                   # finite in float64, overflows float32
        return None
    n_lines = len(newlines)
    return _Block(
        label_counts=np.bincount(tok_line[is_label], weights=commas[is_label] + 1,
                                 minlength=n_lines).astype(np.int64),
        labels=labels.astype(np.int64),
        feat_counts=np.bincount(tok_line[feat], minlength=n_lines).astype(np.int64),
        feat_idx=pairs[:, 0].astype(np.int64),
        feat_val=values)


def _show(token: bytes) -> str:
    text = token.decode("utf-8", errors="backslashreplace")
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _parse_index(token: bytes, what: str, limit: int, limit_name: str, path: str, line_no: int,
                 limits_from: str = "from the header") -> int:
    if token.startswith(b"-") and token[1:].isdigit():
        raise DataError.at(path, line_no, f"negative {what} {_show(token)}")
    if not token.isdigit():
        raise DataError.at(path, line_no, f"bad {what} {_show(token)} (want a non-negative integer)")
    value = int(token)
    if value >= limit:
        raise DataError.at(path, line_no, f"{what} {value} >= number of {limit_name} {limit} ({limits_from})")
    return value


def _parse_line(line: bytes, path: str, line_no: int, num_features: int, num_labels: int,
                limits_from: str = "from the header") -> tuple[list[int], list[int], list[float]]:
    """The reference parser for one line: (labels, feature indices, feature values); DataError naming the
    line and the first bad token otherwise."""
    tokens = line.split()
    labels: list[int] = []
    if tokens and b":" not in tokens[0]:
        labels = [_parse_index(t, "label", num_labels, "labels", path, line_no, limits_from)
                  for t in tokens[0].split(b",")]
        tokens = tokens[1:]
    idx, val = [], []
    for token in tokens:
        parts = token.split(b":")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise DataError.at(path, line_no, f"bad feature token {_show(token)} (want index:value)")
        idx.append(_parse_index(parts[0], "feature index", num_features, "features", path, line_no, limits_from))
        text = parts[1].decode("ascii", errors="replace")
        if not _VALUE_RE.fullmatch(text):
            raise DataError.at(path, line_no, f"non-numeric feature value {_show(parts[1])}")
        value = np.float32(float(text))
        if not np.isfinite(value):
            raise DataError.at(path, line_no, f"feature value {_show(parts[1])} is not a finite float32")
        val.append(float(value))
    return labels, idx, val


def _parse_block_slow(block: bytes, path: str, first_line: int, num_features: int, num_labels: int,
                      limits_from: str = "from the header") -> _Block:
    lines = block.split(b"\n")[:-1]
    parsed = [_parse_line(ln, path, first_line + i, num_features, num_labels, limits_from)
              for i, ln in enumerate(lines)]
    return _Block(
        label_counts=np.array([len(p[0]) for p in parsed], dtype=np.int64),
        labels=np.array([x for p in parsed for x in p[0]], dtype=np.int64),
        feat_counts=np.array([len(p[1]) for p in parsed], dtype=np.int64),
        feat_idx=np.array([x for p in parsed for x in p[1]], dtype=np.int64),
        feat_val=np.array([x for p in parsed for x in p[2]], dtype=np.float32))


def _parse_header(header: bytes, path: str) -> tuple[int, int, int]:
    fields = header.split()
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        raise DataError.at(path, 1, f"bad header {_show(header.strip())}: want 'points features labels'")
    points, features, labels = (int(f) for f in fields)
    if features == 0 or labels == 0:
        raise DataError.at(path, 1, f"bad header {_show(header.strip())}: features and labels must be > 0")
    return points, features, labels


def _is_header(line: bytes) -> bool:
    fields = line.split()
    return len(fields) == 3 and all(f.isdigit() for f in fields)


def _block_rows(block: _Block, keep: np.ndarray) -> _Block:
    """The lines `keep` (bool [lines]) of a parsed block."""
    rows = np.flatnonzero(keep)
    _, f_pos = _gather_rows(_csr(block.feat_counts), rows)
    _, l_pos = _gather_rows(_csr(block.label_counts), rows)
    return _Block(block.label_counts[rows], block.labels[l_pos], block.feat_counts[rows], block.feat_idx[f_pos],
                  block.feat_val[f_pos])


def _parse_file(path: str, model_dims: tuple[int, int] | None = None,
                share: tuple[int, int] | None = None) -> XCData:
    """The points of an XC file. With model_dims (num_features, num_labels of a trained model), the header is
    optional (bare `[labels] f:v f:v` lines from line 1) and the ids are checked against the model's sizes.
    With share (index, count), only the points i with i % count == index are kept, block by block, so the
    whole file is never held at once (its every line is still parsed and checked)."""
    limits_from = "from the header"
    index, count = share or (0, 1)
    with open(path, "rb") as f:
        header = f.readline()
        if model_dims is None or _is_header(header):
            if not header.strip():
                raise DataError.at(path, 1, "empty file" if not header else "missing header 'points features labels'")
            num_points, num_features, num_labels = _parse_header(header, path)
            line_no = first_line = 2
        else:
            num_points, line_no, first_line = None, 1, 1
            f.seek(0)
        if model_dims is not None:
            (num_features, num_labels), limits_from = model_dims, "the model's"
        blocks: list[_Block] = []
        filled: list[np.ndarray] = []  # global indices of the lines with content (for the count checks)
        rest = b""
        while True:
            chunk = f.read(_BLOCK_BYTES)
            if not chunk:
                if not rest:
                    break
                chunk, rest = rest + b"\n", b""        # a last line without a newline
                cut = len(chunk)
            else:
                chunk = rest + chunk
                cut = chunk.rfind(b"\n") + 1
                chunk, rest = chunk[:cut], chunk[cut:]
                if not cut:
                    rest = chunk + rest
                    continue
            block = _parse_block_fast(chunk, num_features, num_labels)
            if block is None:
                block = _parse_block_slow(chunk, path, line_no, num_features, num_labels, limits_from)
            lines = np.arange(line_no - first_line, line_no - first_line + len(block.label_counts))
            filled.append(lines[(block.label_counts + block.feat_counts) > 0][-1:])
            if num_points is not None and np.any(late := (lines >= num_points) & (block.label_counts + block.feat_counts > 0)):
                raise DataError.at(path, int(lines[late][0]) + first_line, f"more points than the {num_points} the "
                                   "header says (a blank line between points is an empty point)")
            keep = (lines % count == index) & (lines < (num_points if num_points is not None else np.inf))
            blocks.append(block if keep.all() else _block_rows(block, keep))
            line_no += len(block.label_counts)
    n_lines = line_no - first_line
    if num_points is None:  # no header: every line is a point, but for blank lines at the end
        last = np.concatenate(filled or [np.zeros(0, np.int64)])
        num_points = int(last[-1]) + 1 if len(last) else 0
    if n_lines < num_points:  # (with a header, a blank line is an empty point, as write_xc writes one)
        raise DataError.at(path, n_lines + first_line, f"file ends after {n_lines} points, the header says {num_points}")

    def cat(name, dtype):
        return np.concatenate([getattr(b, name) for b in blocks] or [np.zeros(0)]).astype(dtype, copy=False)

    mine = len(range(index, num_points, count))  # the points kept: trailing blank lines dropped
    label_counts, feat_counts = cat("label_counts", np.int64)[:mine], cat("feat_counts", np.int64)[:mine]
    return XCData(
        feat_indptr=_csr(feat_counts),
        feat_indices=cat("feat_idx", np.int32)[:feat_counts.sum()],
        feat_values=cat("feat_val", np.float32)[:feat_counts.sum()],
        label_indptr=_csr(label_counts),
        label_indices=cat("labels", np.int32)[:label_counts.sum()],
        num_features=num_features, num_labels=num_labels, source=path,
        share=Share.modulo(index, count, num_points) if share else None)


# -------------------------------------------------------------------------------------------------- cache


def cache_path(path: str | os.PathLike) -> str:
    """Where read_xc keeps the binary copy of `path`: beside it, `<file>.hwrepro.npz`."""
    return os.fspath(path) + _CACHE_SUFFIX


def _cache_stamp(path: str, st: os.stat_result) -> np.ndarray:
    """What a cache must match: format version, file size and the SHA-1 of the file's bytes (so an edit that
    keeps the size and the modification time is caught too; hashing is far faster than parsing)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha1").digest()
    return np.concatenate([np.array([_CACHE_VERSION, st.st_size], dtype=np.int64),
                           np.frombuffer(digest, dtype=np.uint8).astype(np.int64)])


def _load_cache(path: str, stamp: np.ndarray) -> XCData | None:
    try:
        with np.load(cache_path(path)) as z:
            if not np.array_equal(z["stamp"], stamp):
                return None
            num_features, num_labels = (int(x) for x in z["dims"])
            return XCData(z["feat_indptr"], z["feat_indices"], z["feat_values"], z["label_indptr"],
                          z["label_indices"], num_features, num_labels, source=path)
    except Exception:  # noqa: BLE001 -- a missing, stale or corrupt cache just means: parse the text again
        return None


def _save_cache(path: str, stamp: np.ndarray, data: XCData) -> None:
    """Writes the cache atomically (temp file + os.replace); a read-only folder or full disk is not an error."""
    target = cache_path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target) or ".", prefix=os.path.basename(target) + ".",
                                   suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, stamp=stamp, dims=np.array([data.num_features, data.num_labels]),
                     feat_indptr=data.feat_indptr, feat_indices=data.feat_indices,
                     feat_values=data.feat_values, label_indptr=data.label_indptr,
                     label_indices=data.label_indices)
        os.replace(tmp, target)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass


def read_xc(path: str | os.PathLike, use_cache: bool = True, share: tuple[int, int] | None = None) -> XCData:
    """Reads an XC-format text file into CSR arrays; DataError (`path:line: problem`) on a malformed file.

    With use_cache, a binary copy `<file>.hwrepro.npz` is written beside the file and reused while the file's
    size and content hash are those it was made from (a load instead of a parse). Lines that are blank after
    the header's count of points are ignored; any other surplus is an error. With share (index, count), only
    the points i with i % count == index are kept (`Share`), parsed block by block and never cached: process
    `index` of a run over `count` processes holds its part of the file, not the whole of it.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise DataError(f"{path}: a folder, not a file of points")
    try:
        st = os.stat(path)
        if share is not None:
            return _parse_file(path, share=share)
        if not use_cache:
            return _parse_file(path)
        stamp = _cache_stamp(path, st)
        cached = _load_cache(path, stamp)
        if cached is not None:
            return cached
        data = _parse_file(path)
        if _same_file(st, os.stat(path)):  # not replaced while it was read: the stamp is of what was parsed
            _save_cache(path, stamp, data)
        return data
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_ino, a.st_size, a.st_mtime_ns) == (b.st_ino, b.st_size, b.st_mtime_ns)


def read_points(path: str | os.PathLike, num_features: int, num_labels: int) -> XCData:
    """Points to predict for a trained model of num_features inputs and num_labels outputs: an XC file (its
    labels optional) or bare feature lines `f:v f:v ...` without a header; DataError (`path:line: problem`) on
    a malformed line or an id the model does not have. Not cached: files to predict are read once."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    try:
        points = _parse_file(path, (num_features, num_labels))
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if points.num_points == 0:
        raise DataError(f"{path}: no points")
    return points


def write_xc(path: str | os.PathLike, data: XCData) -> None:
    """Writes `data` in the XC text format; values with 9 significant digits, so float32 round-trips exactly."""
    tokens = [f"{i}:{v:.9g}" for i, v in zip(data.feat_indices.tolist(), data.feat_values.tolist())]
    labels = data.label_indices.tolist()
    fp, lp = data.feat_indptr.tolist(), data.label_indptr.tolist()
    with open(path, "w", encoding="ascii") as f:
        f.write(f"{data.num_points} {data.num_features} {data.num_labels}\n")
        for i in range(data.num_points):
            f.write(",".join(map(str, labels[lp[i]:lp[i + 1]])) + " " + " ".join(tokens[fp[i]:fp[i + 1]]) + "\n")


def find_split_files(folder: str | os.PathLike, name: str) -> tuple[str, str] | None:
    """(train, test) text files of data set `name` under `folder`, or None when they are not there.

    Looks in `folder/name` (name matched ignoring case, '-' and '_', so 'amazon670k' finds 'Amazon-670K')
    and in `folder` itself, for `train.txt`/`test.txt` (how Amazon-670K ships) or `X_train.txt`/`X_test.txt`.
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return None

    def norm(s):
        return re.sub(r"[-_ ]", "", s).lower()

    candidates = [os.path.join(folder, d) for d in sorted(os.listdir(folder))
                  if norm(d) == norm(name) and os.path.isdir(os.path.join(folder, d))] + [folder]
    for d in candidates:
        train, test = os.path.join(d, "train.txt"), os.path.join(d, "test.txt")
        if os.path.isfile(train) and os.path.isfile(test):
            return train, test
        for train in sorted(glob.glob(os.path.join(glob.escape(d), "*_train.txt"))):
            test = train[:-len("_train.txt")] + "_test.txt"
            if os.path.isfile(test):
                return train, test
    return None


# ---------------------------------------------------------------------------------------------- synthetic


@dataclasses.dataclass(frozen=True)
class XCShape:
    """Dimensions and statistics a synthetic data set imitates."""

    name: str
    num_features: int
    num_labels: int
    num_train: int
    num_test: int
    features_per_point: float     # mean distinct features per point
    labels_per_point: float       # mean labels per point
    label_zipf: float = 0.6       # p(label of popularity rank r) ∝ r^-label_zipf
    feature_zipf: float = 1.0     # p(noise feature of rank r) ∝ r^-feature_zipf (word-like)
    signature_size: int = 16      # features each label owns
    signal: float = 0.5           # share of a point's feature draws taken from its labels' signatures


SHAPES = {
    "amazon670k": XCShape("amazon670k", 135_909, 670_091, 490_449, 153_025, 75.0, 5.4),
    "wikilsh325k": XCShape("wikilsh325k", 1_617_899, 325_056, 1_778_351, 587_084, 42.0, 3.2),
    # Amazon-3M: sizes from the XC repository (design.md); per-point statistics are Amazon-670K's, not measured on it.
    "amazon3m": XCShape("amazon3m", 337_067, 2_812_281, 1_717_899, 742_507, 75.0, 5.4),
    "tiny": XCShape("tiny", 2_000, 300, 4_000, 1_000, 20.0, 2.5, signature_size=8, signal=0.6),
}


@dataclasses.dataclass(frozen=True)
class _Model:
    """The generative model shared by the train and test splits."""

    label_cdf: np.ndarray     # float64 [L] cumulative label popularity
    noise_cdf: np.ndarray     # float64 [F] cumulative noise-feature popularity
    signatures: np.ndarray    # int32 [L, S] the features each label owns
    idf: np.ndarray           # float64 [F] inverse document frequency implied by the model


def _zipf_cdf(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Cumulative popularity of n items whose popularity ranks are a random permutation (so id != rank)."""
    rank = rng.permutation(n).astype(np.float64)
    p = (rank + 1.0) ** -exponent
    return np.cumsum(p / p.sum())


def _draw(cdf: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """int64 [size] draws from the distribution with cumulative probabilities `cdf` (inverse transform)."""
    return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), len(cdf) - 1)


def _make_model(shape: XCShape, rng: np.random.Generator) -> _Model:
    label_cdf = _zipf_cdf(shape.num_labels, shape.label_zipf, rng)
    noise_cdf = _zipf_cdf(shape.num_features, shape.feature_zipf, rng)
    signatures = rng.integers(0, shape.num_features, size=(shape.num_labels, shape.signature_size),
                              dtype=np.int32)
    # Expected share of all feature draws that land on each feature -> an idf like a real tf-idf vocabulary's.
    label_p = np.diff(label_cdf, prepend=0.0)
    sig_p = np.bincount(signatures.ravel(), weights=np.repeat(label_p / shape.signature_size,
                                                              shape.signature_size),
                        minlength=shape.num_features)
    share = (1 - shape.signal) * np.diff(noise_cdf, prepend=0.0) + shape.signal * sig_p
    idf = np.log1p(1.0 / (shape.features_per_point * share + 1e-12))
    return _Model(label_cdf, noise_cdf, signatures, idf)


def _unique_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys and their multiplicities; sorts `keys` in place (saves a copy of ~50M int64)."""
    keys.sort()
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(first)
    return keys[starts], np.diff(starts, append=len(keys))


def _draw_points(shape: XCShape, model: _Model, n: int, draw_factor: float,
                 rng: np.random.Generator) -> XCData:
    """n points: labels by the power law, features mostly from those labels' signatures, tf-idf values."""
    F, L, S = shape.num_features, shape.num_labels, shape.signature_size
    # Labels: 1 + Poisson, drawn by popularity, duplicates within a point merged.
    n_lab = 1 + rng.poisson(shape.labels_per_point - 1, n)
    lab_keys = np.repeat(np.arange(n, dtype=np.int64), n_lab) * L + _draw(model.label_cdf, int(n_lab.sum()), rng)
    lab_keys, _ = _unique_counts(lab_keys)
    lab_rows, labels = np.divmod(lab_keys, L)
    label_indptr = _csr(np.bincount(lab_rows, minlength=n))
    n_lab = np.diff(label_indptr)

    # Feature draws per point: over-dispersed (gamma-Poisson), like document lengths; at least one.
    lam = rng.gamma(2.0, shape.features_per_point * draw_factor / 2.0, n)
    n_draw = np.maximum(rng.poisson(lam), 1)
    n_sig = rng.binomial(n_draw, shape.signal)
    rows_sig = np.repeat(np.arange(n, dtype=np.int64), n_sig)
    # A signal draw picks one of the point's labels uniformly, then one feature of that label's signature.
    pick = label_indptr[rows_sig] + (rng.random(len(rows_sig)) * n_lab[rows_sig]).astype(np.int64)
    sig_feats = model.signatures[labels[pick], rng.integers(0, S, len(rows_sig))]
    del pick
    rows_noise = np.repeat(np.arange(n, dtype=np.int64), n_draw - n_sig)
    keys = np.concatenate([rows_sig * F + sig_feats, rows_noise * F + _draw(model.noise_cdf, len(rows_noise), rng)])
    del rows_sig, sig_feats, rows_noise
    keys, tf = _unique_counts(keys)
    rows, feats = np.divmod(keys, F)
    del keys
    values = (1.0 + np.log(tf)) * model.idf[feats]
    values /= np.sqrt(np.bincount(rows, weights=values * values, minlength=n))[rows]   # unit L2 per point
    return XCData(_csr(np.bincount(rows, minlength=n)), feats.astype(np.int32), values.astype(np.float32),
                  label_indptr, labels.astype(np.int32), F, L, source="")


def synthetic(shape: str | XCShape = "amazon670k", num_train: int | None = None, num_test: int | None = None,
              seed: int = 0) -> tuple[XCData, XCData]:
    """(train, test) drawn from one generative model with `shape`'s dimensions; deterministic per seed.

    Labels follow a power law (a few head labels, a long tail seen once or never). Each label owns
    `signature_size` random features; a point draws its labels, then `signal` of its feature occurrences from
    its labels' signatures and the rest from a Zipfian "vocabulary", so features predict labels and
    precision@k is meaningful. Repeated features become tf, values are (1 + log tf) * idf, L2-normalised.
    The train and test streams are independent: changing num_train does not change the test set.
    """
    spec = SHAPES[shape] if isinstance(shape, str) else shape
    n_train = spec.num_train if num_train is None else num_train
    n_test = spec.num_test if num_test is None else num_test
    model_rng, pilot_rng, train_rng, test_rng = (np.random.default_rng(s)
                                                 for s in np.random.SeedSequence(seed).spawn(4))
    model = _make_model(spec, model_rng)
    # Merging repeated features lowers the distinct count below the draws; a small pilot measures by how
    # much, so the mean distinct features per point lands near the target for any shape.
    factor = 1.0
    for _ in range(2):
        pilot = _draw_points(spec, model, 20_000, factor, pilot_rng)
        factor *= spec.features_per_point / pilot.features_per_point().mean()
    splits = []
    for name, n, rng in (("train", n_train, train_rng), ("test", n_test, test_rng)):
        data = _draw_points(spec, model, n, factor, rng)
        splits.append(dataclasses.replace(data, source=f"synthetic (seed {seed}, {spec.name} shape, {name})"))
    return splits[0], splits[1]


def share_of(data: XCData, index: int, count: int) -> XCData:
    """Process `index` of `count`'s share of a split held whole (the points i with i % count == index)."""
    return dataclasses.replace(data.take(np.arange(index, data.num_points, count)),
                               share=Share.modulo(index, count, data.num_points))


def load_splits(folder: str | os.PathLike | None, name: str, seed: int = 0, num_train: int | None = None,
                num_test: int | None = None, share: tuple[int, int] | None = None) -> tuple[XCData, XCData]:
    """The real (train, test) of data set `name` (a SHAPES key) found under `folder` (find_split_files), or
    the synthetic stand-in of that shape when no folder is given; `source` of each split says which it is.
    A folder without the files is a DataError saying what was looked for and what is there, never a silent
    fallback; so is a test file whose header disagrees with the train file's. num_train/num_test only size
    the synthetic stand-in. With share (index, count), each split is this process's share (`read_xc`); the
    synthetic stand-in is drawn whole, then all but the share dropped."""
    if not folder:
        splits = synthetic(name, num_train, num_test, seed)
        return splits if share is None else (share_of(splits[0], *share), share_of(splits[1], *share))
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise DataError(f"data.dir={folder}: no such folder")
    files = find_split_files(folder, name)
    if files is None:
        present = sorted(os.listdir(folder))
        shown = ", ".join(present[:8]) + (", ..." if len(present) > 8 else "") if present else "nothing"
        raise DataError(f"data.dir={folder}: no {name} train/test text files (looked for train.txt + test.txt "
                        f"or *_train.txt + *_test.txt, in the folder and in a sub-folder named like {name!r}); "
                        f"found: {shown}")
    train, test = read_xc(files[0], share=share), read_xc(files[1], share=share)
    if (test.num_features, test.num_labels) != (train.num_features, train.num_labels):
        raise DataError(f"{files[1]}:1: header gives {test.num_features} features and {test.num_labels} labels, "
                        f"but {files[0]} gives {train.num_features} and {train.num_labels}")
    return train, test


# ------------------------------------------------------------------------------------------------ batches


@dataclasses.dataclass(frozen=True)
class Truncation:
    """What fixed-width padding cut off: points over the width, and entries dropped in total."""

    points_over_features: int
    features_dropped: int
    points_over_labels: int
    labels_dropped: int


def _pad_rows(indptr: np.ndarray, entries: np.ndarray, rows: np.ndarray, width: int, pad) -> np.ndarray:
    """[len(rows), width]: each row's first `width` entries, then `pad`."""
    starts = indptr[rows]
    lens = np.minimum(indptr[rows + 1] - starts, width)
    cols = np.arange(width)
    valid = cols[None, :] < lens[:, None]
    if not len(entries):
        return np.full((len(rows), width), pad, dtype=entries.dtype)
    return np.where(valid, entries[np.where(valid, starts[:, None] + cols, 0)], pad).astype(entries.dtype)


class XCBatcher:
    """Cuts an XCData into fixed-shape batches of the shared format.

    A point with more than max_features features keeps its max_features largest-valued ones (the rows that
    need it are re-ordered once, here, not per batch); a point with more than max_labels labels keeps the first
    max_labels in file order. `truncation` counts both, of the points held here (run.json sums them over
    processes).

    Of a process's share of a split (data.share), batches are still of the whole split's points, the same in
    every process: each process fills the rows it holds and the others' arrive through
    hwrepro.harness.parallel.merge_over_processes (a collective: every process draws the same batches).
    """

    def __init__(self, data: XCData, max_features: int, max_labels: int):
        self.data = data
        self.num_points = data.share.num_points if data.share is not None else data.num_points
        self.max_features = max_features
        self.max_labels = max_labels
        n_feat, n_lab = data.features_per_point(), data.labels_per_point()
        self.truncation = Truncation(
            points_over_features=int(np.sum(n_feat > max_features)),
            features_dropped=int(np.sum(np.maximum(n_feat - max_features, 0))),
            points_over_labels=int(np.sum(n_lab > max_labels)),
            labels_dropped=int(np.sum(np.maximum(n_lab - max_labels, 0))))
        self._feat_indices, self._feat_values = data.feat_indices, data.feat_values
        if self.truncation.points_over_features:
            self._feat_indices, self._feat_values = self._largest_first(n_feat > max_features)

    def _largest_first(self, over: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the feature arrays where each over-long row is sorted by decreasing value."""
        d = self.data
        pos = np.flatnonzero(np.repeat(over, d.features_per_point()))
        rows = np.searchsorted(d.feat_indptr, pos, side="right") - 1
        order = pos[np.lexsort((-d.feat_values[pos], rows))]   # stable: equal values keep file order
        indices, values = d.feat_indices.copy(), d.feat_values.copy()
        indices[pos], values[pos] = d.feat_indices[order], d.feat_values[order]
        return indices, values

    def batch(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The batch of points `rows` (int [B]): feat_ids/feat_vals [B, max_features], labels [B, max_labels]."""
        rows = np.asarray(rows, dtype=np.int64)
        share = self.data.share
        if share is None:
            return self._rows(rows)
        from hwrepro.harness.parallel import merge_over_processes

        mine = share.owned[rows]
        part = self._rows(share.local[rows[mine]])
        filled = {k: np.zeros((len(rows),) + v.shape[1:], v.dtype) for k, v in part.items()}
        for k, v in part.items():
            filled[k][mine] = v
        return merge_over_processes(filled)

    def _rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """`batch` of rows held here."""
        d = self.data
        return {
            "feat_ids": _pad_rows(d.feat_indptr, self._feat_indices, rows, self.max_features,
                                  d.num_features).astype(np.int32),
            "feat_vals": _pad_rows(d.feat_indptr, self._feat_values, rows, self.max_features, 0.0),
            "labels": _pad_rows(d.label_indptr, d.label_indices, rows, self.max_labels,
                                d.num_labels).astype(np.int32),
        }

    def steps_per_epoch(self, batch_size: int, drop_remainder: bool = True) -> int:
        n = self.num_points
        return n // batch_size if drop_remainder else -(-n // batch_size)

    def epoch(self, batch_size: int, seed: int, epoch: int = 0, shuffle: bool = True,
              drop_remainder: bool = True) -> Iterator[dict[str, np.ndarray]]:
        """One pass: every point at most once (exactly once unless drop_remainder drops the last partial
        batch, whose points differ from epoch to epoch). The order is a permutation drawn from (seed, epoch),
        so epoch e is the same whether or not epochs 0..e-1 were run. Without drop_remainder the last batch is
        smaller (a second jit compilation; for evaluation use `ordered`, which pads instead)."""
        n = self.num_points
        order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
        for i in range(self.steps_per_epoch(batch_size, drop_remainder)):
            yield self.batch(order[i * batch_size:(i + 1) * batch_size])

    def epochs(self, batch_size: int, seed: int, start_epoch: int = 0,
               shuffle: bool = True) -> Iterator[dict[str, np.ndarray]]:
        """Endless training batches, epoch after epoch, each with a fresh permutation (drop_remainder)."""
        if self.steps_per_epoch(batch_size) == 0:
            raise ValueError(f"batch size {batch_size} exceeds the {self.num_points} points of {self.data.source}")
        epoch = start_epoch
        while True:
            yield from self.epoch(batch_size, seed, epoch, shuffle)
            epoch += 1

    def ordered(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """All points in order, for final evaluation: fixed-shape batches with `mask` bool [B] added; the
        last batch is padded with empty rows (all padding ids, mask False), so no point is dropped or
        counted twice."""
        n = self.num_points
        for start in range(0, n, batch_size):
            yield pad_batch(self.batch(np.arange(start, min(start + batch_size, n))), batch_size,
                            self.data.num_features, self.data.num_labels)


def pad_batch(batch: dict[str, np.ndarray], batch_size: int, num_features: int,
              num_labels: int) -> dict[str, np.ndarray]:
    """A batch of at most batch_size points padded to exactly batch_size rows with empty points (padding
    feature and label ids, zero values), and `mask` bool [batch_size] added, False at those rows: jitted
    evaluation then sees one shape, and the empty rows have no labels to count."""
    short = batch_size - len(batch["labels"])
    pads = {"feat_ids": num_features, "feat_vals": 0.0, "labels": num_labels}
    out = {k: np.pad(v, ((0, short), (0, 0)), constant_values=pads[k]) for k, v in batch.items()}
    out["mask"] = np.arange(batch_size) < batch_size - short
    return out


def batches(data: XCData, batch_size: int, max_features: int, max_labels: int, seed: int,
            shuffle: bool = True, drop_remainder: bool = True, epoch: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """One epoch of batches of `data` (see XCBatcher.epoch); build an XCBatcher to see truncation counts."""
    return XCBatcher(data, max_features, max_labels).epoch(batch_size, seed, epoch, shuffle, drop_remainder)


def fixed_subset(data: XCData, n: int, seed: int) -> XCData:
    """A fixed random subset of min(n, N) points, in shuffled order, for periodic evaluation.

    SLIDE's code evaluated on the first test lines of a label-sorted file (a biased sample) and crashed when
    asked for more points than the file has; here the subset is uniform and clamps to the whole split.
    """
    total = data.share.num_points if data.share is not None else data.num_points
    m = min(n, total)
    rows = np.random.default_rng(seed).permutation(total)[:m]
    source = f"{data.source}, random subset of {m} (seed {seed})"
    if data.share is None:
        return data.take(rows, source=source)
    local, share = data.share.subset(rows)  # a share's subset: this process's points of the same subset
    return dataclasses.replace(data.take(local, source=source), share=share)


# ------------------------------------------------------------------------------------- what training reads


@dataclasses.dataclass
class LabelData:
    """A data set of kind "labels" as the SLIDE experiment reads it: batches in the shared format (feat_ids,
    feat_vals, labels; see XCBatcher), a fixed shuffled `subset` for evaluation during training, and the
    `test` points of the final evaluation (each with `ordered(batch_size)`, padded batches with a mask)."""

    source: str
    num_features: int
    num_labels: int
    num_train: int
    steps_per_epoch: int
    subset: Any
    test: Any
    num_test: int
    details: dict[str, Any]
    train_batches: Callable[[], Iterator[dict[str, np.ndarray]]]
    label_slots: int  # the labels width of the training batches (evaluation batches may be wider)


def evaluation_label_width(data: XCData, max_labels: int) -> int:
    """The labels width of evaluation batches: max_labels (training's), or the most labels a point of `data`
    has (over every process's share), so that no label is cut off."""
    from hwrepro.harness.parallel import each_process

    widest = int(data.labels_per_point().max()) if data.num_points else 0
    return max(max_labels, int(each_process(np.int64(widest)).max()))


def _split_statistics(train: XCBatcher, final: XCBatcher) -> dict[str, Any]:
    """run.json's statistics of a run's training points and final evaluation points: the truncation counts and
    the mean features and labels a training point. Of the whole split when processes each hold a share (summed
    over them: a collective)."""
    from hwrepro.harness.parallel import each_process

    names = [f.name for f in dataclasses.fields(Truncation)]
    local = np.array([*(getattr(train.truncation, n) for n in names), *(getattr(final.truncation, n) for n in names),
                      train.data.features_per_point().sum(), train.data.labels_per_point().sum()], np.int64)
    total = each_process(local).sum(axis=0) if train.data.share is not None else local
    k = len(names)
    return {"truncation_train": dict(zip(names, map(int, total[:k]))),
            "truncation_test": dict(zip(names, map(int, total[k:2 * k]))),
            "features_per_point": float(total[-2] / train.num_points),
            "labels_per_point": float(total[-1] / train.num_points)}


def label_data(train: XCData, test: XCData, config: Any) -> LabelData:
    """LabelData of a (train, test) pair for a run's config (data.max_features / max_labels widths,
    train.batch_size, eval.subset / final_points, data.seed for the evaluation subsets, seed for the order)."""
    d = config.data
    batcher = XCBatcher(train, d.max_features, d.max_labels)
    if batcher.steps_per_epoch(config.train.batch_size) == 0:
        raise ConfigError(f"train.batch_size={config.train.batch_size} exceeds the {batcher.num_points} training "
                          f"points of {train.source}")
    final = test if not config.eval.final_points else fixed_subset(test, config.eval.final_points, d.seed)
    # Evaluation keeps every label of a point (a correct prediction of a label cut off would count as a miss).
    width = evaluation_label_width(test, d.max_labels)
    final_batcher = XCBatcher(final, d.max_features, width)
    subset = XCBatcher(fixed_subset(test, config.eval.subset, d.seed), d.max_features, width)
    source = train.source if "synthetic" in train.source else f"{train.source} + {test.source}"
    num_test = test.share.num_points if test.share is not None else test.num_points
    details = {"num_train": batcher.num_points, "num_test": num_test, "num_final_eval": final_batcher.num_points,
               "num_features": train.num_features, "num_labels": train.num_labels,
               **_split_statistics(batcher, final_batcher)}
    if train.share is not None:
        details["points_held"] = {"train": train.num_points, "test": test.num_points}
    return LabelData(source=source, num_features=train.num_features, num_labels=train.num_labels,
                     num_train=batcher.num_points, steps_per_epoch=batcher.steps_per_epoch(config.train.batch_size),
                     subset=subset, test=final_batcher, num_test=final_batcher.num_points, details=details,
                     train_batches=lambda: batcher.epochs(config.train.batch_size, seed=config.seed),
                     label_slots=d.max_labels)


def _register_shape(name: str) -> None:
    @register(name, kind="labels")
    def load(config: Any) -> LabelData:
        from hwrepro.harness.parallel import place

        d, where = config.data, place()  # a run over several processes: each reads its share of the points
        train, test = load_splits(d.dir if d.source == "auto" else None, name, seed=d.seed, num_train=d.num_train or None,
                                  num_test=d.num_test or None, share=where and (where.index, where.count))
        return label_data(train, test, config)


for _name in SHAPES:
    _register_shape(_name)
