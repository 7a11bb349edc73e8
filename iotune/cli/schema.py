"""`iotune schema`: the published JSON Schemas of iotune's machine output
(run.json, fleet.json and the --json of every command), listed, printed, or
used to check a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import IotuneError, UsageError
from .options import json_option, library_errors


@click.command()
@click.argument("name", required=False)
@click.option("--path", "show_path", is_flag=True, help="Print where the schema file is instead of its text.")
@click.option("--validate", "documents", multiple=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Check a JSON file against the schema (repeatable); exit 1 if one does not conform.")
@json_option
@library_errors
def schema(name: str | None, show_path: bool, documents: tuple[Path, ...], as_json: bool) -> None:
    """List the JSON Schemas, or print one (NAME: e.g. run, run-1, sweep).

    \b
    Examples:
      iotune schema                                       what each schema covers
      iotune schema run > run-1.json                      the schema of a saved run.json
      iotune trace --json -- dd ... > t.json && iotune schema trace-report --validate t.json
    """
    from ..resources import schema_names, schema_path

    if name is None:
        if show_path or documents:
            raise UsageError("--path and --validate need a schema NAME (iotune schema lists them)")
        listing = [(n, _load(schema_path(n)).get("title", "")) for n in schema_names()]
        if as_json:
            click.echo(json.dumps([{"name": n, "title": t} for n, t in listing], indent=1))
        else:
            width = max(len(n) for n, _ in listing)
            click.echo("".join(f"{n:<{width}}  {title}\n" for n, title in listing), nl=False)
        return
    if show_path and documents:
        raise UsageError("--path prints where the schema is, --validate checks files against it: give one")
    path = schema_path(name)
    if not documents:
        if show_path:
            click.echo(json.dumps({"name": path.stem, "path": str(path)}) if as_json else str(path))
        else:
            click.echo(path.read_text(), nl=False)      # a schema is JSON already: the same with --json
        return
    problems = {doc: _problems(_load(path), _load(doc)) for doc in documents}
    if as_json:
        verdicts = [{"file": str(doc), "conforms": not found, "problems": found} for doc, found in problems.items()]
        click.echo(json.dumps({"schema": path.stem, "documents": verdicts}, indent=1))
    failures = [f"{doc}: {msg}" for doc, found in problems.items() for msg in found]
    if failures:
        raise IotuneError(f"does not conform to {path.stem}:\n  " + "\n  ".join(failures))
    if not as_json:
        click.echo("".join(f"{doc}: conforms to {path.stem}\n" for doc in documents), nl=False)


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is not readable JSON: {e}") from None


def _problems(schema_doc: dict[str, Any], doc: Any, limit: int = 20) -> list[str]:
    """What in `doc` breaks the schema: "at /json/pointer: message", at most `limit`."""
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import best_match
    except ImportError:
        raise UsageError("--validate needs the jsonschema package: pip install jsonschema") from None
    # an error under anyOf (a record or null) is reported from the branch that fits best
    errors = [best_match([e]) or e for e in Draft202012Validator(schema_doc).iter_errors(doc)]
    errors.sort(key=lambda e: list(map(str, e.absolute_path)))
    return [f"at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:limit]]
