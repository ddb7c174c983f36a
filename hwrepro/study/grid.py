"""Sweeps written in a config: which points a sweep has, what each is called, and which shard runs it.

A sweep config is an ordinary experiment config with one more field, `sweep` (no JAX here; the launcher runs
each point in its own process, with the base config, i.e. the config without `sweep`, plus the point's
overrides):

    config.sweep = ml_collections.ConfigDict()
    config.sweep.axes = {"numerics": {"precision": ["fp32", "bf16"], "cpu_max_isa": ["AVX2", "AVX512"]},
                         "seed": [0, 1, 2]}                        # grid: the Cartesian product, 12 points
    config.sweep.order = ("numerics.precision", "numerics.cpu_max_isa", "seed")   # optional axis order
    config.sweep.aliases = {"numerics": {"cpu_max_isa": "isa"}}   # optional short names used in point names
    config.sweep.points = [{"numerics.precision": "bf16", "numerics.param_dtype": "bf16"}]  # optional

- `axes` maps a config field to the list of its values. A ConfigDict refuses dots in its keys, so fields
  are written nested as above; dotted keys work too where the mapping allows them. Axes come in `order`
  first, then in the mapping's order (a ConfigDict's is alphabetical). The first axis varies slowest.
- `points` is an explicit list of {field: value} dicts (plain dicts inside a list keep dotted keys and their
  order). With both, every explicit point is combined with every grid point.
- A point's name is `alias=value` pairs joined by commas, e.g. `precision=bf16,isa=AVX2,seed=0`: the alias
  of a field is its last component unless `aliases` says otherwise (or two axes share a last component, then
  the whole dotted field). Names use only [A-Za-z0-9._+=,-], are unique, and are at most 200 characters
  (longer ones are cut and end in a hash of the whole name), so each is a directory name on any filesystem.

`expand` checks every field and value against the base config up front, so a typo fails before the first
point runs rather than in the middle of a sweep.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import itertools
import numbers
import re
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import ml_collections

from hwrepro.errors import ConfigError
from hwrepro.harness.config import dotted_fields

SWEEP_FIELDS = ("axes", "points", "order", "aliases")
BASE_NAME = "base"   # the name of the single point of a config without a sweep
MAX_NAME_LENGTH = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
_ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


class Point(NamedTuple):
    """One run of a sweep: its directory-safe name and {dotted field: value} to set on the base config."""
    name: str
    overrides: dict[str, Any]


def _is_mapping(x: Any) -> bool:
    return isinstance(x, (Mapping, ml_collections.ConfigDict))


def _resolve(config: ml_collections.ConfigDict, field: str) -> tuple[ml_collections.ConfigDict, str]:
    """(the ConfigDict holding `field`, its last key); ConfigError if the field does not exist or is a group."""
    parts = field.split(".")
    node = config
    for depth, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict) or not part or part not in node:
            known = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else "none"
            where = ".".join(parts[:depth]) or "the config"
            raise ConfigError(f"unknown config field {field!r}: {where} has no field {part!r} (it has: {known})")
        if depth < len(parts) - 1:
            node = node[part]
    if isinstance(node[parts[-1]], ml_collections.ConfigDict):
        raise ConfigError(f"config field {field!r} is a group of fields; override its fields one by one")
    return node, parts[-1]


def _coerce(field: str, expected: type, current: Any, value: Any) -> Any:
    """`value` converted to the field's type, or ConfigError naming the field.

    Allowed: the same type; int -> float (widening, never the reverse); list <-> tuple; anything for a
    field that is None with no declared type; None only for a field that is None now. bool is not an int
    here (Python says it is, but `seed=True` is a mistake).
    """
    def mismatch():
        return ConfigError(f"config field {field!r} is {expected.__name__} ({current!r}), "
                           f"got {type(value).__name__} {value!r}")
    if expected is type(None):
        return value
    if value is None:
        if current is None:
            return value
        raise mismatch()
    if expected is bool:
        if isinstance(value, bool):
            return value
        raise mismatch()
    if isinstance(value, bool):
        raise mismatch()
    if expected is int and isinstance(value, numbers.Integral):
        return int(value)
    if expected is float and isinstance(value, numbers.Real):
        return float(value)
    if expected in (list, tuple) and isinstance(value, (list, tuple)):
        return expected(value)
    if isinstance(value, expected):
        return value
    raise mismatch()


def _checked(config: ml_collections.ConfigDict, field: str, value: Any) -> tuple[ml_collections.ConfigDict,
                                                                                   str, Any]:
    """(holder, key, coerced value) for setting `field` of config to value; ConfigError if it cannot be."""
    holder, key = _resolve(config, field)
    return holder, key, _coerce(field, holder.get_type(key), holder[key], value)


def _without_sweep(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """An unlocked deep copy of config without its `sweep` field (FieldReferences between fields survive)."""
    out = copy.deepcopy(config)
    out.unlock()
    if "sweep" in out:
        del out["sweep"]
    return out


def apply(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A copy of the base config (config without `sweep`), unlocked, with {dotted field: value} set.

    Every field must exist and every value must match its field's type (int -> float widening allowed),
    else ConfigError (a ValueError) naming the field. The input config is not changed.
    """
    out = _without_sweep(config)
    for field, value in overrides.items():
        holder, key, coerced = _checked(out, field, value)
        holder[key] = coerced
    return out


def parse_settings(items: Iterable[str]) -> dict[str, Any]:
    """{dotted field: value} from "FIELD=VALUE" texts (a script's --set), for `apply` (which checks fields and
    types): each value read as a Python literal (16, 1e-3, "dwta"), anything else as a string (dwta)."""
    fields = {}
    for item in items:
        field, _, text = item.partition("=")
        try:
            fields[field] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            fields[field] = text
    return fields


def _format_value(value: Any) -> str:
    """A short text for a value in a point name (not yet made filesystem-safe)."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)  # shortest text that round-trips: 0.001, 1e-05
    if isinstance(value, (list, tuple)):
        return "_".join(_format_value(v) for v in value)
    return str(value)


def short_names(fields: Iterable[str], explicit: Mapping[str, str]) -> dict[str, str]:
    """{field: alias}: explicit ones first, else the last component, else (on a clash) the whole field."""
    fields = list(dict.fromkeys(fields))
    last = [f.rsplit(".", 1)[-1] for f in fields]
    out = {f: explicit.get(f, short if last.count(short) == 1 else f) for f, short in zip(fields, last)}
    for field, alias in out.items():
        if not _ALIAS.fullmatch(alias):
            raise ConfigError(f"sweep alias {alias!r} of {field!r} must be letters, digits and ._+- "
                              "(not starting with ._+-)")
    clashes = sorted({a for a in out.values() if list(out.values()).count(a) > 1})
    if clashes:
        raise ConfigError(f"sweep aliases are not unique: {', '.join(clashes)}; set sweep.aliases")
    return out


def point_aliases(config: ml_collections.ConfigDict, aliases: Mapping[str, str] | None = None) -> dict[str, str]:
    """{dotted field: its short name in point names} for every field config's sweep sets ({} without a sweep);
    `aliases` as in `expand`."""
    sweep = config.get("sweep")
    if not _is_mapping(sweep):
        return {}
    fields = [f for p in _explicit_points(sweep) for f in p] + [f for f, _ in _axes(sweep)]
    return short_names(fields, {**dotted_fields(sweep.get("aliases") or {}), **(aliases or {})})


def point_name(overrides: Mapping[str, Any], aliases: Mapping[str, str]) -> str:
    """`alias=value,...` for these overrides, filesystem-safe and at most MAX_NAME_LENGTH characters."""
    if not overrides:
        return BASE_NAME
    name = ",".join(f"{aliases[f]}={_UNSAFE.sub('_', _format_value(v))}" for f, v in overrides.items())
    if len(name) > MAX_NAME_LENGTH:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        name = f"{name[:MAX_NAME_LENGTH - len(digest) - 1]}-{digest}"
    return name


def _axes(sweep: ml_collections.ConfigDict) -> list[tuple[str, list[Any]]]:
    """[(field, values)] of sweep.axes, in sweep.order first, then in the mapping's order."""
    axes = dotted_fields(sweep.get("axes") or {})
    order = list(sweep.get("order") or ())
    unknown = [f for f in order if f not in axes]
    if unknown or len(set(order)) != len(order):
        raise ConfigError(f"sweep.order must name distinct axes of sweep.axes; bad: {unknown or order}")
    fields = order + [f for f in axes if f not in order]
    for field in fields:
        if not isinstance(axes[field], (list, tuple)) or not axes[field]:
            raise ConfigError(f"sweep.axes {field!r} must be a non-empty list of values, got {axes[field]!r}")
    return [(f, list(axes[f])) for f in fields]


def _explicit_points(sweep: ml_collections.ConfigDict) -> list[dict[str, Any]]:
    """sweep.points as [{dotted field: value}] (nested dicts flattened); [{}] when there are none."""
    points = sweep.get("points") or ()
    if not isinstance(points, (list, tuple)) or not all(_is_mapping(p) for p in points):
        raise ConfigError("sweep.points must be a list of {field: value} dicts")
    return [dotted_fields(p) for p in points] or [{}]


def expand(config: ml_collections.ConfigDict, aliases: Mapping[str, str] | None = None) -> list[Point]:
    """The points of config's sweep, in a stable order; [Point('base', {})] when it has none.

    `aliases` ({dotted field: short name}) add to and override sweep.aliases. Raises ConfigError for an
    unknown sweep field, an unknown config field, a value of the wrong type, or two points with one name.
    """
    sweep = config.get("sweep")
    if sweep is None:
        return [Point(BASE_NAME, {})]
    if not _is_mapping(sweep):
        raise ConfigError(f"config.sweep must be a ConfigDict, got {type(sweep).__name__}")
    unknown = sorted(set(sweep.keys()) - set(SWEEP_FIELDS))
    if unknown:
        raise ConfigError(f"unknown sweep field(s) {', '.join(unknown)}; known: {', '.join(SWEEP_FIELDS)}")
    axes = _axes(sweep)
    explicit = _explicit_points(sweep)
    axis_fields = [f for f, _ in axes]
    for p in explicit:
        both = sorted(set(p) & set(axis_fields))
        if both:
            raise ConfigError(f"sweep field(s) {', '.join(both)} are set both in sweep.points and sweep.axes")

    # Check every value against the base config now, and keep it as apply will set it (1 -> 1.0).
    base = _without_sweep(config)
    coerce = lambda field, value: _checked(base, field, value)[2]
    explicit = [{f: coerce(f, v) for f, v in p.items()} for p in explicit]
    axes = [(f, [coerce(f, v) for v in values]) for f, values in axes]

    names = point_aliases(config, aliases)
    points = []
    for p, combo in itertools.product(explicit, itertools.product(*(values for _, values in axes))):
        overrides = {**p, **dict(zip(axis_fields, combo))}
        points.append(Point(point_name(overrides, names), overrides))
    seen: dict[str, dict[str, Any]] = {}
    for point in points:
        if point.name in seen:
            raise ConfigError(f"two sweep points are both named {point.name!r}: {seen[point.name]} and "
                              f"{point.overrides}; make their values or aliases distinct")
        seen[point.name] = point.overrides
    return points


def shard(points: Sequence[Point], spec: str) -> list[Point]:
    """Points i, i+n, i+2n, ... for spec "i/n": n round-robin shards, disjoint, together all points.

    Round robin rather than contiguous blocks, so each shard gets a spread of the grid (the slow, e.g.
    single-thread, points do not all land in one shard).
    """
    match = _SHARD.fullmatch(spec)
    if not match:
        raise ConfigError(f"shard {spec!r}: expected 'i/n' with integers 0 <= i < n, e.g. '0/4'")
    i, n = int(match.group(1)), int(match.group(2))
    if not 0 <= i < n:
        raise ConfigError(f"shard {spec!r}: need 0 <= i < n (shard i of n, counted from 0)")
    return list(points[i::n])
