"""Extension by name, through the public registries only: a toy hash family and a toy data set, registered
from outside the package, train a SLIDE network chosen by config fields; unknown names are one clear error."""

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hwrepro import data, experiments
from hwrepro.data import xc
from hwrepro.errors import ConfigError
from hwrepro.harness import runner
from hwrepro.models import MODELS
from hwrepro.sparse import lsh
from hwrepro.sparse.hashes import FAMILIES

CALLS = {"hash": [], "data": []}


@FAMILIES.register("toy_coordinates")
class CoordinateHash(NamedTuple):
    """Bit k of table l is x[dims[l, k]] > 0: a deliberately simple hash family."""

    dims: jax.Array  # int32 [L, K]

    @staticmethod
    def init(key, dim, num_hashes, num_tables):
        CALLS["hash"].append((dim, num_hashes, num_tables))
        return CoordinateHash(jax.random.randint(key, (num_tables, num_hashes), 0, dim))

    @property
    def num_tables(self):
        return self.dims.shape[0]

    @property
    def num_buckets(self):
        return 2 ** self.dims.shape[1]

    def table_codes(self, x):
        bits = x[:, self.dims] > 0  # [n, L, K]
        return jnp.sum(bits * (1 << jnp.arange(self.dims.shape[1])), axis=-1).astype(jnp.int32).T


TOY_SHAPE = xc.XCShape("toy", 400, 60, 1_500, 300, 10.0, 2.0, signature_size=6, signal=0.7)


@data.register("toy_labels", kind="labels")
def load_toy_labels(config):
    CALLS["data"].append(config.data.seed)
    train, test = xc.synthetic(TOY_SHAPE, seed=config.data.seed)
    return xc.label_data(train, test, config)


def test_toy_hash_family_builds_tables_by_its_codes():
    fn = lsh.init_hash("toy_coordinates", jax.random.key(0), dim=16, num_hashes=3, num_tables=4)
    weights = jax.random.normal(jax.random.key(1), (200, 16))
    tables = lsh.build_tables(fn, weights, jax.random.key(2))
    codes = np.asarray(lsh.codes(fn, weights))  # [200, 4]
    ids, starts = np.asarray(tables.ids), np.asarray(tables.starts)
    for table in range(4):
        for bucket in range(fn.num_buckets):
            members = ids[table, starts[table, bucket]:starts[table, bucket + 1]]
            assert set(members) == set(np.flatnonzero(codes[:, table] == bucket))


@pytest.mark.slow
def test_toy_hash_family_and_data_set_train_slide_by_config_name(tmp_path):
    from configs.slide_amazon import slide_config

    CALLS["hash"].clear()
    c = slide_config("toy_labels", "lsh")
    c.lsh.kind = "toy_coordinates"
    c.lsh.num_hashes, c.lsh.num_tables = 4, 6
    c.model.hidden, c.model.num_candidates = 16, 32
    c.data.max_features, c.data.max_labels = 16, 4
    c.train.num_steps, c.train.batch_size, c.train.learning_rate = 150, 32, 1e-2
    c.lsh.rebuild_period, c.lsh.rebuild_decay, c.lsh.redraw_period = 50, 0.0, 100
    c.eval.subset, c.eval.batch_size = 64, 64
    final = runner.run_here(c, tmp_path / "toy", quiet=True)
    assert CALLS["data"] == [0]
    assert CALLS["hash"] == [(16, 4, 6)] * 2  # drawn at the start, redrawn after step 100
    assert final["rebuilds"] == 3 and 0.0 <= final["test_lsh_P@1"] <= 1.0  # after steps 50, 100 and 150
    train = xc.synthetic(TOY_SHAPE, seed=0)[0]
    assert final["test_P@1"] > 2 * train.label_counts().max() / train.num_points  # learnt something
    run = json.loads((tmp_path / "toy" / "run.json").read_text())
    assert run["data_source"].startswith("synthetic (seed 0, toy shape")


def test_registries_list_builtins_and_name_unknown_entries():
    assert {"simhash", "dwta"} <= set(FAMILIES.names())
    assert {"amazon670k", "wikilsh325k", "text8", "tiny"} <= set(data.names("labels"))
    assert data.names("images") == ["fashion_mnist", "mnist"]
    assert {"mlp_autoencoder", "prednet"} <= set(MODELS.names())
    assert experiments.names() == ["autoencoder", "prednet", "slide"]
    with pytest.raises(ConfigError, match=r"lsh.kind='simhsh' is not a known hash family \(did you mean 'simhash'"):
        lsh.init_hash("simhsh", jax.random.key(0), 8, 2, 2)
    with pytest.raises(ConfigError, match="data.dataset='mnist' provides images, this experiment needs labels"):
        data.get("mnist", "labels")
    with pytest.raises(ConfigError, match="experiment='slid' is not a known experiment"):
        experiments.module_name("slid")
    with pytest.raises(ValueError, match="registered already"):
        FAMILIES.register("simhash", CoordinateHash)


def test_a_model_of_another_experiment_is_refused_by_its_fields():
    from configs.autoencoder_mnist import get_config as autoencoder
    from configs.prednet_small import get_config as prednet

    for get_config, other, field in [(autoencoder, "prednet", "encoder_sizes"),
                                     (prednet, "mlp_autoencoder", "stack_sizes")]:
        config = get_config()
        config.model.name = other
        with pytest.raises(ConfigError, match=f"model.name='{other}' takes no '{field}'"):
            experiments.get(config.experiment).validate(config)
