"""One table of sweep settings (iotune.sweep.bounds): a profile and
`iotune sweep`'s flags accept and refuse the same values, and the published
JSON Schemas admit every value the table accepts."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.cli.sweep.aio import aio as sweep     # the settings BOUNDS checks are the aio sweep's
from iotune.errors import UsageError
from iotune.resources import schema_names, schema_path
from iotune.sweep.bounds import BOUNDS, SECTOR, Bound
from iotune.sweep.space import RunSettings, SearchSpace, load_profile


def refused(b: Bound) -> list[Any]:
    """Values just outside the bound, and of the wrong kind."""
    if b.kind == "bool":
        return ["maybe"]
    if b.kind == "choice":
        return ["nope"]
    if b.kind == "size":
        return [-SECTOR, 0, int(b.min or 0) - SECTOR, int(b.min or 0) + 1]
    assert b.min is not None
    below = [b.min - 1] if b.kind == "int" else [b.min - 0.5]
    above = [] if b.max is None else [b.max] if b.max_open else [b.max + 1]
    return [*below, *above, *([1.5] if b.kind == "int" else [])]


def accepted(b: Bound) -> list[Any]:
    if b.kind == "bool":
        return [True, False]
    if b.kind == "choice":
        return list(b.choices)
    assert b.min is not None
    if b.kind == "size":
        return [int(b.min), 1 << 20]
    top = [] if b.max is None else [b.max - 0.5] if b.max_open else [b.max]
    return [int(b.min) if b.kind == "int" else b.min, *(int(t) if b.kind == "int" else t for t in top)]


def toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value)


def flag_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def profile_with(tmp_path: Path, b: Bound, value: Any) -> Path:
    path = tmp_path / "p.toml"
    written = f"[{toml(value)}]" if b.section == "space" else toml(value)
    path.write_text(f"[{b.section}]\n{b.key} = {written}\n")
    return path


CASES = [(key, value) for key, b in BOUNDS.items() for value in refused(b)]
GOOD = [(key, value) for key, b in BOUNDS.items() for value in accepted(b)]


def test_every_setting_has_one_bound_and_every_flag_exists() -> None:
    settings = {f.name for f in fields(SearchSpace)} | {f.name for f in fields(RunSettings)}
    assert set(BOUNDS) == settings
    options = {opt for p in sweep.params for opt in p.opts}
    assert {b.flag for b in BOUNDS.values() if b.flag} <= options
    for f in fields(SearchSpace):
        assert all(BOUNDS[f.name].check(v) == v for v in getattr(SearchSpace(), f.name))
    for f in fields(RunSettings):
        assert BOUNDS[f.name].check(getattr(RunSettings(), f.name)) == getattr(RunSettings(), f.name)


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v!r}" for k, v in CASES])
def test_profile_and_flag_refuse_the_same_value(tmp_path: Path, key: str, value: Any) -> None:
    b = BOUNDS[key]
    with pytest.raises(UsageError) as info:
        load_profile(str(profile_with(tmp_path, b, value)))
    assert f"[{b.section}] {key} (line 2): " in str(info.value) and str(info.value).endswith(b.rule())
    if b.flag is None:
        return
    r = CliRunner().invoke(cli, ["sweep", b.flag, flag_text(value), "-o", str(tmp_path / "j")])
    assert r.exit_code == 2, r.output
    assert f"Invalid value for '{b.flag}': " in r.stderr and r.stderr.rstrip().endswith(b.rule()), r.stderr
    assert not (tmp_path / "j").exists()


@pytest.mark.parametrize("key,value", GOOD, ids=[f"{k}={v!r}" for k, v in GOOD])
def test_profile_and_flag_accept_the_same_value(tmp_path: Path, key: str, value: Any) -> None:
    b = BOUNDS[key]
    prof = load_profile(str(profile_with(tmp_path, b, value)))
    section = prof.space if b.section == "space" else prof.run
    assert getattr(section, key) == ((value,) if b.section == "space" else value)
    if b.flag is None:
        return
    [option] = [p for p in sweep.params if b.flag in p.opts]
    with click.Context(sweep) as ctx:
        parsed = option.process_value(ctx, flag_text(value))
    assert parsed == ((value,) if b.section == "space" else value)


def test_the_schemas_admit_every_value_the_table_accepts() -> None:
    """The published schemas describe output, including files written by
    older iotune versions (whose flags took block sizes under 4096): they
    are not generated from the table, and may be looser, never stricter."""
    points = {name: defs["point"]["properties"] for name in schema_names()
              if "point" in (defs := json.loads(schema_path(name).read_text()).get("$defs", {}))}
    assert sorted(points) == ["sweep-2", "sweep-layouts-2"]
    for name, point in points.items():
        for key, prop in point.items():
            b = BOUNDS[key]
            if b.kind == "choice":
                assert set(b.choices) <= set(prop["enum"]), (name, key)
            elif b.kind == "bool":
                assert prop["type"] == "boolean", (name, key)
            else:
                assert prop["type"] == "integer" and prop["minimum"] <= (b.min or 0), (name, key)
                assert "maximum" not in prop or (b.max is not None and prop["maximum"] >= b.max), (name, key)
