"""hwrepro.study.grid: grid order, point names, explicit points, validation, apply and sharding."""

import re
from pathlib import Path

import ml_collections
import pytest

from hwrepro.harness import runner
from hwrepro.study import sweep
from hwrepro.study import grid
from hwrepro.harness.config import base_config, load_config_file
from hwrepro.errors import ConfigError

SAFE_NAME = re.compile(r"[A-Za-z0-9._+=,-]+")


def sweep_config(**sweep) -> ml_collections.ConfigDict:
    """The shared base config with a `sweep` field, locked as a config file's get_config() would leave it."""
    config = base_config("test")
    config.sweep = sweep
    config.lock()
    return config


def test_no_sweep_is_one_base_point():
    assert grid.expand(base_config("test")) == [grid.Point("base", {})]


def test_grid_is_cartesian_product_first_axis_slowest_in_given_order():
    config = sweep_config(
        axes={"numerics": {"precision": ["fp32", "bf16"], "cpu_max_isa": ["AVX2", "AVX512"], "threads": [1]},
              "seed": [0, 1]},
        order=("numerics.precision", "numerics.cpu_max_isa", "numerics.threads", "seed"),
        aliases={"numerics": {"cpu_max_isa": "isa"}})
    names = [p.name for p in grid.expand(config)]
    assert names == [
        "precision=fp32,isa=AVX2,threads=1,seed=0", "precision=fp32,isa=AVX2,threads=1,seed=1",
        "precision=fp32,isa=AVX512,threads=1,seed=0", "precision=fp32,isa=AVX512,threads=1,seed=1",
        "precision=bf16,isa=AVX2,threads=1,seed=0", "precision=bf16,isa=AVX2,threads=1,seed=1",
        "precision=bf16,isa=AVX512,threads=1,seed=0", "precision=bf16,isa=AVX512,threads=1,seed=1",
    ]
    assert grid.expand(config)[5].overrides == {
        "numerics.precision": "bf16", "numerics.cpu_max_isa": "AVX2", "numerics.threads": 1, "seed": 1}


def test_without_order_axes_follow_the_configdict_alphabetical_order_and_are_stable():
    config = sweep_config(axes={"seed": [0, 1], "numerics": {"precision": ["fp32", "bf16"]}})
    names = [p.name for p in grid.expand(config)]
    assert names == ["precision=fp32,seed=0", "precision=fp32,seed=1", "precision=bf16,seed=0",
                     "precision=bf16,seed=1"]
    assert names == [p.name for p in grid.expand(config)]


def test_partial_order_puts_named_axes_first():
    config = sweep_config(axes={"seed": [0], "numerics": {"precision": ["fp32"], "threads": [1]}},
                          order=("seed",))
    assert grid.expand(config)[0].name == "seed=0,precision=fp32,threads=1"


def test_aliases_argument_overrides_config_and_clashing_last_components_use_the_whole_field():
    config = base_config("test")
    config.model = ml_collections.ConfigDict({"size": 8})
    config.data.size = 100
    config.sweep = {"axes": {"model": {"size": [8]}, "data": {"size": [100]}, "train": {"learning_rate": [0.01]}}}
    assert grid.expand(config)[0].name == "data.size=100,model.size=8,learning_rate=0.01"
    renamed = grid.expand(config, aliases={"model.size": "width", "train.learning_rate": "lr"})
    assert renamed[0].name == "data.size=100,width=8,lr=0.01"


def test_clashing_explicit_aliases_and_unsafe_aliases_are_errors():
    config = sweep_config(axes={"seed": [0], "train": {"batch_size": [8]}})
    with pytest.raises(ConfigError, match="not unique"):
        grid.expand(config, aliases={"train.batch_size": "seed"})
    with pytest.raises(ConfigError, match="alias 'batch size'"):
        grid.expand(config, aliases={"train.batch_size": "batch size"})


def test_value_formatting_and_int_to_float_widening():
    config = sweep_config(axes={"train": {"learning_rate": [1e-3, 1e-5, 1]},
                                "numerics": {"fast_math": [True, False]}})
    points = grid.expand(config)
    assert [p.name for p in points] == [  # numerics.fast_math sorts before train.learning_rate
        "fast_math=true,learning_rate=0.001", "fast_math=true,learning_rate=1e-05",
        "fast_math=true,learning_rate=1.0", "fast_math=false,learning_rate=0.001",
        "fast_math=false,learning_rate=1e-05", "fast_math=false,learning_rate=1.0"]
    widened = points[-1].overrides["train.learning_rate"]
    assert widened == 1.0 and isinstance(widened, float)


def test_names_are_filesystem_safe_unique_and_bounded():
    config = sweep_config(axes={"data": {"dir": ["/data/amazon 670k", "C:\\x", "a,b=c", "x" * 300]},
                                "seed": [0, 1]})
    points = grid.expand(config)
    names = [p.name for p in points]
    assert len(set(names)) == len(names) == 8
    assert all(SAFE_NAME.fullmatch(n) and len(n) <= grid.MAX_NAME_LENGTH for n in names)
    assert names[0] == "dir=_data_amazon_670k,seed=0"
    long_names = [n for n in names if len(n) == grid.MAX_NAME_LENGTH]
    assert len(long_names) == 2 and long_names[0] != long_names[1]  # cut names keep a hash of the whole
    assert names == [p.name for p in grid.expand(config)]


def test_values_that_sanitise_to_the_same_name_are_an_error():
    config = sweep_config(axes={"data": {"dir": ["a/b", "a_b"]}})
    with pytest.raises(ConfigError, match="both named 'dir=a_b'"):
        grid.expand(config)


def test_explicit_points_keep_their_order_and_dotted_keys():
    config = sweep_config(points=[
        {"numerics.precision": "bf16", "numerics.param_dtype": "bf16"},
        {"numerics.precision": "fp32", "numerics.param_dtype": "fp32"},
        {"seed": 3},
    ])
    points = grid.expand(config)
    assert [p.name for p in points] == ["precision=bf16,param_dtype=bf16", "precision=fp32,param_dtype=fp32",
                                        "seed=3"]
    assert points[2].overrides == {"seed": 3}


def test_explicit_points_times_axes():
    config = sweep_config(points=[{"numerics.precision": "bf16"}, {"numerics.precision": "fp32"}],
                          axes={"seed": [0, 1]})
    assert [p.name for p in grid.expand(config)] == [
        "precision=bf16,seed=0", "precision=bf16,seed=1", "precision=fp32,seed=0", "precision=fp32,seed=1"]


def test_field_in_both_points_and_axes_is_an_error():
    config = sweep_config(points=[{"seed": 1}], axes={"seed": [0, 1]})
    with pytest.raises(ConfigError, match="seed are set both"):
        grid.expand(config)


@pytest.mark.parametrize("axes, match", [
    ({"numerics": {"precison": ["fp32"]}}, "unknown config field 'numerics.precison'"),
    ({"seed2": [0]}, "unknown config field 'seed2'"),
    ({"numerics": ["fp32"]}, "'numerics' is a group of fields"),
    ({"seed": 0}, "'seed' must be a non-empty list"),
    ({"seed": []}, "'seed' must be a non-empty list"),
])
def test_bad_axes_name_the_field(axes, match):
    with pytest.raises(ConfigError, match=match):
        grid.expand(sweep_config(axes=axes))


def test_a_field_below_a_leaf_is_unknown():
    with pytest.raises(ConfigError, match="unknown config field 'seed.x'"):
        grid.expand(sweep_config(points=[{"seed.x": 1}]))


@pytest.mark.parametrize("field, value", [
    ("seed", "0"), ("seed", 1.5), ("seed", True), ("seed", None), ("numerics.fast_math", 1),
    ("numerics.precision", 16), ("train.learning_rate", "1e-3"),
])
def test_type_mismatch_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"config field '{re.escape(field)}' is"):
        grid.expand(sweep_config(points=[{field: value}]))
    with pytest.raises(ValueError, match=f"config field '{re.escape(field)}' is"):
        grid.apply(base_config("test"), {field: value})


def test_unknown_sweep_field_and_bad_order_are_errors():
    with pytest.raises(ConfigError, match="unknown sweep field"):
        grid.expand(sweep_config(axis={"seed": [0]}))
    with pytest.raises(ConfigError, match="sweep.order"):
        grid.expand(sweep_config(axes={"seed": [0]}, order=("numerics.precision",)))


def test_apply_sets_overrides_on_an_unlocked_copy_without_sweep():
    config = sweep_config(axes={"seed": [0, 1]})
    point = grid.expand(config)[1]
    out = grid.apply(config, {**point.overrides, "train.learning_rate": 2, "numerics.precision": "bf16"})
    assert out.seed == 1 and out.train.learning_rate == 2.0 and isinstance(out.train.learning_rate, float)
    assert out.numerics.precision == "bf16"
    assert "sweep" not in out and not out.is_locked
    assert config.seed == 0 and config.numerics.precision == "fp32" and "sweep" in config  # input unchanged


def test_apply_keeps_field_references():
    config = base_config("test")
    config.train.eval_batch_size = config.train.get_ref("batch_size")
    out = grid.apply(config, {"train.batch_size": 32})
    assert out.train.eval_batch_size == 32 and config.train.eval_batch_size == 128


def test_apply_list_and_tuple_and_untyped_fields():
    config = base_config("test")
    config.model = ml_collections.ConfigDict({"hidden": (128,), "extra": None})
    out = grid.apply(config, {"model.hidden": [256, 64], "model.extra": "anything"})
    assert out.model.hidden == (256, 64) and out.model.extra == "anything"


def test_shards_are_disjoint_round_robin_and_cover_every_point_once():
    points = grid.expand(sweep_config(axes={"seed": list(range(7))}))
    for n in range(1, 9):
        shards = [grid.shard(points, f"{i}/{n}") for i in range(n)]
        flat = [p for s in shards for p in s]
        assert sorted(p.name for p in flat) == sorted(p.name for p in points) and len(flat) == 7
    assert [p.overrides["seed"] for p in grid.shard(points, "1/3")] == [1, 4]
    assert grid.shard(points, " 0 / 1 ") == points


@pytest.mark.parametrize("spec", ["3/3", "-1/2", "1/0", "a/b", "1", "1/2/3", ""])
def test_bad_shard_specs_are_clear_errors(spec):
    with pytest.raises(ValueError, match=r"shard .*0 <= i < n"):
        grid.shard([], spec)


CONFIG_FILES = sorted(Path(__file__).resolve().parents[1].glob("configs/*.py"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.stem for p in CONFIG_FILES])
def test_every_shipped_config_and_sweep_point_passes_validation(path):
    # What the launcher checks before anything runs: a config that fails here would stop at its first line.
    config = load_config_file(path)
    for point in grid.expand(config):
        runner.validate(sweep.point_config(config, point))


def test_set_texts_become_typed_fields_for_apply():
    fields = grid.parse_settings(["train.learning_rate=3e-3", "lsh.kind=dwta", "lsh.kind2='dwta'",
                                  "model.hidden=64", "eval.lsh.tables=training"])
    assert fields == {"train.learning_rate": 3e-3, "lsh.kind": "dwta", "lsh.kind2": "dwta", "model.hidden": 64,
                      "eval.lsh.tables": "training"}
    assert grid.apply(base_config("test"), grid.parse_settings(["train.learning_rate=2"])).train.learning_rate == 2.0
