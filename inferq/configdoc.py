"""docs/configuration.md, generated from the `Settings` class so the two never disagree.

`render()` builds the page: one row per field of `inferq.shared.settings.Settings`, in
declaration order, with its environment variable, type, default and description. Run
`python -m inferq.configdoc [PATH]` from the repository root to rewrite the file
(default `docs/configuration.md`); `tests/tools/test_docs.py` fails while it is out of date.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from inferq.shared.settings import Settings

DEFAULT_PATH = Path("docs/configuration.md")
REGENERATE = ".venv/bin/python -m inferq.configdoc"

HEADER = f"""\
# Configuration

Every setting is an environment variable, `INFERQ_` plus the field's name in capitals.
Each process reads them once at start; command-line options such as `--model` override
them. An invalid value stops `inferq` at start with `inferq: invalid configuration: ...`
and exit code 2.

This page is generated from `shared/settings.py` (the `Settings` class: names, types,
defaults and the `description` of each `Field`). Change the descriptions there, then run
`{REGENERATE}`; `tests/tools/test_docs.py` fails while this page is out of date.
"""

_SCALARS = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
    SecretStr: "string (secret: never logged)",
}


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _type(annotation: Any) -> str:
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return f"{_type(inner)}, optional"
    if origin is list:
        return "comma-separated list"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bounds(field: FieldInfo) -> str:
    """`Field(gt=0, le=60)` as "> 0, ≤ 60" (pydantic keeps each bound as one metadata item)."""
    signs = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))
    return ", ".join(
        f"{sign} {getattr(item, attr)}"
        for item in field.metadata
        for attr, sign in signs
        if getattr(item, attr, None) is not None
    )


def _size(value: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale and value % scale == 0:
            return f" ({value // scale} {unit})"
    return ""


def _default(name: str, field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None:
        return "unset"
    if value in ("", []):
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, int) and name.endswith("_bytes"):
        return f"`{value}`{_size(value)}"
    return f"`{value}`"


def rows() -> list[tuple[str, str, str, str]]:
    """(variable, type, default, description) per setting, in declaration order."""
    out = []
    for name, field in Settings.model_fields.items():
        kind = _type(field.annotation)
        if bounds := _bounds(field):
            kind = f"{kind}, {bounds}"
        out.append(
            (f"`INFERQ_{name.upper()}`", kind, _default(name, field), field.description or "")
        )
    return out


def render() -> str:
    """The whole of docs/configuration.md."""
    lines = [HEADER, "| variable | type | default | description |", "|---|---|---|---|"]
    lines += [" | ".join(["", *(_cell(c) for c in row), ""]).strip() for row in rows()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page to PATH (default docs/configuration.md, relative to the current dir)."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
