"""Where iotune's data files are: the BPF probe sources (probes/), the
sweep profiles (profiles/), the startup hook (trace/inject/) and the JSON
Schemas of iotune's machine output (schemas/). Stdlib only; any layer may
import it.

The first two sit at the top of the repository and are shipped as the
package data `iotune.probes` and `iotune.profiles` (pyproject.toml maps the
two subpackages onto them), so a regular `pip install` can trace and sweep.
They are located with importlib.resources; when iotune runs from a source
checkout (tests with PYTHONPATH, an editable install) the checkout's own
copies are used, so an edited probe is the one that gets compiled.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import IotuneError, UsageError

PROBES, PROFILES = "probes", "profiles"
# A file each directory must hold (tells the checkout copy from anything else).
_MARKERS = {PROBES: "blockio.c", PROFILES: "default.toml"}


def package_root() -> Path:
    """The directory holding the `iotune` package (put it on PYTHONPATH to
    run `python -m iotune....` in a child process)."""
    return Path(__file__).resolve().parent.parent


def _data_dir(kind: str) -> Path:
    checkout = package_root() / kind
    if (checkout / _MARKERS[kind]).is_file():
        return checkout
    try:
        found = Path(str(resources.files(f"iotune.{kind}")))
    except ModuleNotFoundError:
        found = None
    if found is None or not (found / _MARKERS[kind]).is_file():
        raise IotuneError(f"iotune's {kind}/ files are missing from this installation: "
                          f"reinstall iotune (pip install iotune, or pip install -e . in a checkout)")
    return found


def probes_dir() -> Path:
    """The directory with the probe C sources and their shared header."""
    return _data_dir(PROBES)


def probe_source(name: str = "blockio.c") -> Path:
    """One probe source file, e.g. probe_source("blockio.h")."""
    path = probes_dir() / name
    if not path.is_file():
        raise IotuneError(f"no probe source named {name} in {path.parent}")
    return path


def profiles_dir() -> Path:
    """The directory with the named sweep profiles (NAME.toml)."""
    return _data_dir(PROFILES)


def profile_names() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.toml"))


def profile_path(name: str) -> Path:
    """Where the named profile's file is (`quick` -> .../profiles/quick.toml);
    the caller checks that it exists (profile_names() lists those that do)."""
    return profiles_dir() / f"{name}.toml"


def inject_dir() -> Path:
    """The startup-hook directory (sitecustomize.py + _iotune_hooks.py) that
    `iotune trace` and `iotune sweep --steps-cmd` put first on a job's
    PYTHONPATH. It ships inside the package (package data of iotune.trace);
    only its location is shared, so the sweep needs no import of trace."""
    path = Path(__file__).resolve().parent / "trace" / "inject"
    if not (path / "sitecustomize.py").is_file():
        raise IotuneError(f"iotune's startup hook is missing ({path / 'sitecustomize.py'}): reinstall iotune "
                          f"(pip install iotune, or pip install -e . in a checkout)")
    return path


def schemas_dir() -> Path:
    """The published JSON Schemas (NAME-MAJOR.json), package data of `iotune`."""
    path = Path(__file__).resolve().parent / "schemas"
    if not path.is_dir() or not any(path.glob("*.json")):
        raise IotuneError(f"iotune's JSON Schemas are missing ({path}): reinstall iotune "
                          f"(pip install iotune, or pip install -e . in a checkout)")
    return path


def schema_names() -> list[str]:
    """Every schema, as NAME-MAJOR (e.g. run-1), sorted."""
    return sorted(p.stem for p in schemas_dir().glob("*.json"))


def schema_path(name: str) -> Path:
    """The file of one schema: `run-1` (or `run-1.json`) names a version,
    `run` the newest version of that document."""
    stem = name.removesuffix(".json")
    names = schema_names()
    if stem not in names:
        versions = [n for n in names if n.rpartition("-")[0] == stem and n.rpartition("-")[2].isdigit()]
        if not versions:
            raise UsageError(f"no JSON Schema named {name}: choose one of {', '.join(names)}")
        stem = max(versions, key=lambda n: int(n.rpartition("-")[2]))
    return schemas_dir() / f"{stem}.json"
