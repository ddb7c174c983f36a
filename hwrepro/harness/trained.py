"""A finished run's model: kept in its workdir by `save`, given back by `load`.

    model = hwrepro.load("runs/lsh_amazon670k-...")     # in any process, on one device
    scores, ids = model.predict(batch)                   # SLIDE: top-5 labels, dense-scored
    scores, ids = model.predict(batch, k=10, lsh=True)   # LSH-scored (inference tables rebuilt, deterministically)

workdir/model/ holds
- params/     the parameters as the experiment's Flax modules take them (what `run` returned and final.json's
              param_sha256 hashes), an orbax PyTree checkpoint, uncompressed;
- model.json  format, hwrepro version, experiment, every array's path, shape and dtype.
The config is the run's config.json, with the settings the run resolved on its machine (final.json's
config_resolved) filled in; whatever else a prediction needs (SLIDE's LSH inference tables) the experiment
rebuilds from the parameters and the config's seed. What `predict` does is the experiment's own
`make_predict(config, params, **options)` (hwrepro.experiments): found by name, like the experiment.

The folder is written beside the run's records under a temporary name and renamed into place whole, so a run
killed while saving leaves no half model (the temporary folder goes with the error, or with the next save).
`load` refuses, in one line (ModelError), a workdir that is not a finished run, keeps no model
(train.keep_model=False), or whose model files are damaged or were written by an incompatible hwrepro: the
loaded parameters must hash to final.json's param_sha256.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

import hwrepro
from hwrepro import experiments
from hwrepro.errors import ConfigError, ModelError
from hwrepro.harness import records

MODEL_DIR = records.MODEL_DIR
FORMAT = 1  # model.json's "format": a change in the layout above that old readers cannot read bumps it
# final.json's {field: value} of config settings the run resolved on its machine (SLIDE: SimHash's dtype "auto"
# for the inference tables): `load` sets them in the config, so prediction anywhere builds the run's tables.
RESOLVED = "config_resolved"


def arrays(params: Any) -> dict[str, tuple[list[int], str]]:
    """{path: (shape, dtype)} of every leaf of a parameter pytree of arrays or jax.ShapeDtypeStructs (model.json's
    listing)."""
    return {jax.tree_util.keystr(path): (list(np.shape(leaf)), str(np.dtype(leaf.dtype)))
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def save(workdir: Path, experiment: str, params: Any) -> int:
    """Writes workdir/model/ (see the module docstring) for `params`, a pytree of arrays fully present in this
    process (host arrays or single-device jax.Arrays); returns its size in bytes. In a run over several
    processes only process 0 calls it: orbax is told to work in this process alone."""
    import orbax.checkpoint as ocp

    workdir = Path(workdir)
    for stale in workdir.glob(f".{MODEL_DIR}.tmp*"):  # an earlier process's save, cut short (the workdir is ours)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = workdir / f".{MODEL_DIR}.tmp{os.getpid()}"
    host = jax.tree_util.tree_map(np.asarray, params)
    only_here = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                   active_processes={jax.process_index()})
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_compression=False,
                                                                multiprocessing_options=only_here),
                                    multiprocessing_options=only_here)
    try:
        checkpointer.save((tmp / "params").absolute(), host)
        checkpointer.close()
        info = {"format": FORMAT, "hwrepro": hwrepro.__version__, "experiment": experiment, "arrays": arrays(host)}
        records.write_json_atomic(tmp / "model.json", info)
        size = _size(tmp)
        shutil.rmtree(workdir / MODEL_DIR, ignore_errors=True)  # an attempt that saved it, then failed to finish
        os.replace(tmp, workdir / MODEL_DIR)
    except OSError as e:
        raise records.RecordWriteError(f"cannot write {workdir / MODEL_DIR}: {e.strerror or e}") from None
    finally:  # whatever stopped it (a full disk, a signal, orbax): no half model left behind
        shutil.rmtree(tmp, ignore_errors=True)
    return size


@dataclasses.dataclass
class Trained:
    """A finished run's model. `config`: the run's config; `params`: the Flax modules' parameters (NumPy
    arrays, the tree `run` returned); `final`: final.json. `predict(inputs, **options)` is the experiment's
    prediction (SLIDE: batch dict -> (scores float32 [B, k], ids int32 [B, k]), options k, lsh, devices;
    autoencoder: images [B, 784] in [0, 1] -> reconstructions; PredNet: frames [B, T, H, W, C] -> next-frame
    predictions); each set of options is built once (e.g. SLIDE's LSH tables)."""

    workdir: Path
    config: ml_collections.ConfigDict
    params: Any
    final: dict[str, Any]
    _predictors: dict = dataclasses.field(default_factory=dict, repr=False)

    def predictor(self, **options: Any) -> Callable:
        """The prediction function for `options` (built on first use, then reused; options left out count as
        make_predict's defaults). Each distinct set holds its own device copy of the parameters (SLIDE's
        LSH-scored ones their tables too): for several k, predict the largest once and slice."""
        module = experiments.get(self.config.experiment)
        if not hasattr(module, "make_predict"):
            raise ModelError(f"experiment {self.config.experiment!r} has no make_predict: its models load "
                             "(config, params) but do not predict")
        defaults = {name: p.default for name, p in inspect.signature(module.make_predict).parameters.items()
                    if p.kind == p.KEYWORD_ONLY}
        key = tuple(sorted({**defaults, **options}.items()))
        if key not in self._predictors:
            self._predictors[key] = module.make_predict(self.config, self.params, **options)
        return self._predictors[key]

    def predict(self, inputs: Any, **options: Any) -> Any:
        return self.predictor(**options)(inputs)


def load(workdir: str | os.PathLike) -> Trained:
    """The model a finished run kept in `workdir` (module docstring); ModelError, one line, when there is none
    usable."""
    workdir = Path(workdir)
    folder = records.model_folder(workdir)
    config = ml_collections.ConfigDict(records.read_run_file(workdir / records.CONFIG_FILE, "experiment"))
    info = records.read_run_file(folder / "model.json", "format", "arrays")
    if info.get("format") != FORMAT:
        raise ModelError(f"{folder} has model format {info.get('format')!r}, this hwrepro "
                         f"({hwrepro.__version__}) reads format {FORMAT}: load it with hwrepro {info.get('hwrepro')}")
    params = _restore(folder / "params")
    final = records.read_run_file(workdir / "final.json")
    if arrays(params) != {k: (list(s), d) for k, (s, d) in info["arrays"].items()} or (
            records.param_sha256(params) != final.get("param_sha256")):
        raise ModelError(f"the model files under {folder} do not hold the parameters final.json's param_sha256 "
                         "names: they are damaged")
    for field, value in final.get(RESOLVED, {}).items():  # what "auto" settings were on the run's machine
        group, name = field.rsplit(".", 1)
        with config.unlocked():
            functools.reduce(getattr, group.split("."), config)[name] = value
    return Trained(workdir, config, params, final)


def _restore(path: Path) -> Any:
    """The parameter tree saved at `path`, as NumPy arrays; ModelError when orbax cannot read it."""
    import orbax.checkpoint as ocp

    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            return jax.tree_util.tree_map(np.asarray, checkpointer.restore(path.absolute()))
    except Exception as e:  # noqa: BLE001 -- orbax/tensorstore raise many types for missing or cut files
        detail = " ".join(str(e).split())[:200]
        raise ModelError(f"cannot read the model under {path.parent}: its files are damaged or truncated "
                         f"({type(e).__name__}: {detail})") from None


def load_params(workdir: str | os.PathLike, like: Any) -> Any:
    """The parameters of the model kept in `workdir`, checked against `like` (a parameter tree of the run to
    start from them: the same paths, shapes and dtypes); ConfigError naming train.init_from otherwise."""
    field = "train.init_from"
    try:
        params = load(workdir).params
    except ModelError as e:
        raise ConfigError(f"{field}={os.fspath(workdir)!r}: {e}") from None
    got, want = arrays(params), arrays(like)
    if got != want:
        diff = next((k for k in want if got.get(k) != want[k]), None) or next(k for k in got if k not in want)
        raise ConfigError(f"{field}={os.fspath(workdir)!r}: its parameters do not fit this config's model "
                          f"({diff}: {_describe(got.get(diff))} there, {_describe(want.get(diff))} here)")
    return params


def start_from(config: ml_collections.ConfigDict, params: Any, rec: Any) -> Any:
    """The parameters a run starts from: `params` (its fresh initialisation), or with train.init_from those of
    that finished run (`load_params` against `params`' shapes, which may be jax.ShapeDtypeStructs; fine-tuning),
    recorded in run.json as init_from (workdir, param_sha256)."""
    if not config.train.init_from:
        return params
    params = jax.tree_util.tree_map(jax.numpy.asarray, load_params(config.train.init_from, params))
    rec.note("init_from", {"workdir": str(Path(config.train.init_from).absolute()),
                           "param_sha256": records.param_sha256(params)})
    rec.print(f"parameters from {config.train.init_from}")
    return params


def _describe(entry: tuple[list[int], str] | None) -> str:
    return "absent" if entry is None else f"{entry[1]} {entry[0]}"

