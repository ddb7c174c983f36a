"""Training-state checkpoints for resuming a run: orbax-checkpoint under workdir/checkpoints/<step>/.

A checkpoint holds every leaf of the training state (parameters, optimizer state, LSH tables, step counter:
whatever pytree the experiment trains) and a small JSON of the loop's host-side state (time spent, an
experiment's counters). Random keys and data order in hwrepro are functions of (seed, step), so the step is
all the position a resumed run needs; it then ends with the bits of an uninterrupted run.

Saving is asynchronous: the state's leaves are copied to host memory (the training step donates, and so
reuses, the device buffers), then orbax writes them in a background thread while training goes on. Only
complete checkpoints count (orbax renames a finished step folder into place), and the last `keep` stay.

A run over several processes (jax.distributed) checkpoints the same way, every process at the same steps
into the one folder (workdir/checkpoints): a leaf split over processes is copied on its devices instead, and
orbax writes each process's shards and restores them onto the same sharding; process 0 writes the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from hwrepro.errors import RunFailed
from hwrepro.harness.records import WorkdirTaken


class Checkpoints:
    """The checkpoints of one run folder: `latest_step`, `save`, `restore`, `close`."""

    def __init__(self, folder: Path, keep: int = 2):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.folder = Path(folder).absolute()
        # Uncompressed: zstd over a 1.3 GB state costs more CPU than the write itself, on cores that train.
        self._manager = ocp.CheckpointManager(
            self.folder, options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                                              create=True),
            item_handlers={"state": ocp.PyTreeCheckpointHandler(use_compression=False),
                           "host": ocp.JsonCheckpointHandler()})

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, host: dict[str, Any]) -> None:
        """Starts saving `state` (a pytree) and `host` (JSON-able) as checkpoint `step`; returns once the
        leaves are copied. Refuses (RunFailed) a state with a non-finite parameter: never keep a broken one."""
        leaves = [_copy(leaf) for leaf in jax.tree_util.tree_leaves(state)]
        for leaf in leaves:
            if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating) and not _finite(leaf):  # bfloat16 too
                raise RunFailed(f"a non-finite value in the training state at step {step}; not checkpointed")
        self._manager.wait_until_finished()  # one write at a time: the previous one must be complete first
        args = self._ocp.args.Composite(state=self._ocp.args.PyTreeSave({str(i): x for i, x in enumerate(leaves)}),
                                        host=self._ocp.args.JsonSave(host))
        try:
            self._manager.save(step, args=args)
        except OSError as e:
            raise RunFailed(f"cannot write checkpoint {self.folder / str(step)}: {e.strerror or e}") from None

    def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """(the state of checkpoint `step` with the structure, dtypes and shapes of `like`, except that a float
        array keeps the float type it was saved in; its host JSON).

        WorkdirTaken, one line, when the checkpoint's arrays are not those of `like` (code that changed the
        training state since it was written): orbax would refuse a different count with a long message, and
        silently restore an array of another shape."""
        leaves, treedef = jax.tree_util.tree_flatten(like)
        saved = {k: (tuple(m.shape), np.dtype(m.dtype)) for k, m in self._manager.item_metadata(step)["state"].items()}
        # A float array comes back in the float type it was saved in: a choice made by the machine, such as
        # SimHash's dtype "auto" (bf16 hyperplanes where bf16 products are native), stays the run's.
        floats = lambda *dtypes: all(jax.numpy.issubdtype(d, jax.numpy.floating) for d in dtypes)
        kept = lambda i, x: (saved[str(i)][1] if str(i) in saved and saved[str(i)][0] == np.shape(x)
                             and floats(saved[str(i)][1], _dtype(x)) else _dtype(x))
        target = {str(i): jax.ShapeDtypeStruct(np.shape(x), kept(i, x), sharding=x.sharding if _split(x) else None)
                  for i, x in enumerate(leaves)}
        if (wanted := {k: (t.shape, np.dtype(t.dtype)) for k, t in target.items()}) != saved:
            raise WorkdirTaken(f"checkpoint {self.folder / str(step)} does not fit this run's training state "
                               f"({_mismatch(saved, wanted)}): it was written by other code; move {self.folder} "
                               "aside to start the run afresh")
        restore_args = self._ocp.checkpoint_utils.construct_restore_args(target)
        out = self._manager.restore(step, args=self._ocp.args.Composite(
            state=self._ocp.args.PyTreeRestore(item=target, restore_args=restore_args),
            host=self._ocp.args.JsonRestore()))
        restored = [out.state[str(i)] if _split(x) else jax.device_put(np.asarray(out.state[str(i)]),
                                                                         getattr(x, "sharding", None))
                    for i, x in enumerate(leaves)]
        return jax.tree_util.tree_unflatten(treedef, restored), dict(out.host)

    def close(self) -> None:
        """Waits for the write in flight (a checkpoint is only kept complete) and releases orbax."""
        try:
            self._manager.wait_until_finished()
        except OSError as e:
            raise RunFailed(f"cannot write a checkpoint under {self.folder}: {e.strerror or e}") from None
        finally:
            self._manager.close()


def _split(x: Any) -> bool:
    """Whether x is an array held in parts by several processes (not all of it readable here)."""
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def _copy(leaf: Any) -> Any:
    """A copy of a state leaf that the next (donating) step cannot overwrite: in host memory, or for a leaf
    split over processes, on its own devices (orbax then copies each process's shards to host)."""
    return jax.numpy.copy(leaf) if _split(leaf) else np.array(leaf, copy=True)


_all_finite = jax.jit(lambda x: jax.numpy.all(jax.numpy.isfinite(x)))  # compiled once per leaf shape, not per save


def _finite(leaf: Any) -> bool:
    if _split(leaf):  # every process computes the same replicated answer
        return bool(np.asarray(_all_finite(leaf).addressable_data(0)))
    return bool(np.all(np.isfinite(leaf)))


def _mismatch(saved: dict[str, tuple], wanted: dict[str, tuple]) -> str:
    """The first difference between two {index: (shape, dtype)} of arrays, in words."""
    if len(saved) != len(wanted):
        return f"{len(saved)} arrays, where the run has {len(wanted)}"
    i = min((k for k in wanted if saved.get(k) != wanted[k]), key=int)
    return f"array {i} is {saved[i][1]} {list(saved[i][0])}, where the run's is {wanted[i][1]} {list(wanted[i][0])}"


def _dtype(x: Any) -> np.dtype:
    """An array's dtype; a Python scalar's as JAX would store it (e.g. TrainState's initial `step` 0: int32)."""
    return x.dtype if hasattr(x, "dtype") else jax.dtypes.canonicalize_dtype(np.asarray(x).dtype)
