"""Every Lua script inferq runs, and the one convention they share.

A script is written against names, never literals: `F.status`, `S.queued`, `FINAL[st]`,
`B.completed`, `BS.cancelling`, `BFINAL[st]`, `FF.expires_at`, `D.job`, `ENTRY_JOB`.
`source` turns the body into what Redis runs, from `inferq.shared.schema` (so renaming a
field changes every script with it): each `F.x`-style name becomes its string literal when
the script is built (`_NAMES`), and the two sets a body tests membership of (`FINAL`,
`BFINAL`: `SETS`) are put in front of it when it uses them. Nothing is built on every call
that could be built once: a table of 25 job fields made per call cost each script call
several microseconds.

| table      | from                  | used by                            |
|------------|-----------------------|------------------------------------|
| `F`, `S`, `FINAL`, `ENTRY_JOB` | `JobField`, `Status` | the queue (`lua.queue`)   |
| `B`, `BS`, `BFINAL` | `BatchField`, `BatchStatus` | batches (`lua.batches`)      |
| `FF`       | `FileField`           | files (`lua.batches`)              |
| `D`        | `DeliveryField`       | webhook deliveries (`lua.webhooks`)|

Scripts are built only from these constants and the bodies in this package, never from
request data: client text in a body would be Lua injection, and every distinct body a new
entry in Redis's script cache, which nothing evicts. `tests/unit/shared/test_lua.py` checks
that no body spells a schema name as a bare literal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

from inferq.shared.schema import (
    BATCH_FINAL,
    ENTRY_JOB,
    FINAL,
    BatchField,
    BatchStatus,
    DeliveryField,
    FileField,
    JobField,
    Status,
)


def _set(values: Iterable[str]) -> str:
    return "{" + ", ".join(f"['{v}']=true" for v in sorted(values)) + "}"


#: The membership sets (`FINAL[st]`): name → its Lua definition, put in front of a body
#: that uses it. Everything else a body names becomes a literal (`_NAMES`, `ENTRY_JOB`).
SETS: dict[str, str] = {
    "FINAL": f"local FINAL = {_set(FINAL)}",
    "BFINAL": f"local BFINAL = {_set(BATCH_FINAL)}",
}
_USES = {name: re.compile(rf"(?<![\w.]){name}\b") for name in SETS}
#: Every value a table above carries: what a body must not spell as a literal.
SCHEMA_NAMES = frozenset(
    str(m)
    for enum in (JobField, Status, BatchField, BatchStatus, FileField, DeliveryField)
    for m in enum
) | {ENTRY_JOB}


#: Name tables a body refers to as `T.member`; each reference becomes the member's literal.
_NAMES: dict[str, type[StrEnum]] = {
    "F": JobField,
    "S": Status,
    "B": BatchField,
    "BS": BatchStatus,
    "FF": FileField,
    "D": DeliveryField,
}
_REFERENCE = re.compile(r"(?<![\w.])(F|S|B|BS|FF|D)\.([a-z_]+)\b")


def uses(body: str) -> list[str]:
    """The sets (`SETS`) `body` tests membership of."""
    return [name for name, pattern in _USES.items() if pattern.search(body)]


def _literal(m: re.Match[str]) -> str:
    table, member = _NAMES[m.group(1)], m.group(2)
    try:
        return f"'{table[member.upper()].value}'"
    except KeyError as e:
        raise ValueError(f"{m.group(0)}: {table.__name__} has no {member.upper()}") from e


def source(body: str) -> str:
    """The script as sent to Redis: name references replaced by their literals, `ENTRY_JOB`
    too, and the sets it tests membership of in front."""
    text = _REFERENCE.sub(_literal, body)
    text = re.sub(r"(?<![\w.])ENTRY_JOB\b", f"'{ENTRY_JOB}'", text)
    return "\n".join([*(SETS[name] for name in uses(body)), text])
