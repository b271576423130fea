"""Every Lua script inferq runs, and the one convention they share.

A script is written against names, never literals: `F.status`, `S.queued`, `FINAL[st]`,
`B.completed`, `BS.cancelling`, `BFINAL[st]`, `FF.expires_at`, `D.job`, `ENTRY_JOB`.
`source` puts in front of a script's body the tables it uses, built from
`inferq.shared.schema` (so renaming a field changes every script with it), and only those:
each table is built on every call, and a script pays only for its own.

| table      | from                  | used by                            |
|------------|-----------------------|------------------------------------|
| `F`, `S`, `FINAL`, `ENTRY_JOB` | `JobField`, `Status` | the queue (`lua.queue`)   |
| `B`, `BS`, `BFINAL` | `BatchField`, `BatchStatus` | batches (`lua.batches`)      |
| `FF`       | `FileField`           | files (`lua.batches`)              |
| `D`        | `DeliveryField`       | webhook deliveries (`lua.webhooks`)|

Scripts are built only from these constants and the bodies in this package, never from
request data (reliability guide #22). `tests/unit/shared/test_lua.py` checks that no body
spells a schema name as a bare literal.
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


def _names(enum: type[StrEnum]) -> str:
    return "{" + ", ".join(f"{m.name.lower()}='{m.value}'" for m in enum) + "}"


def _set(values: Iterable[str]) -> str:
    return "{" + ", ".join(f"['{v}']=true" for v in sorted(values)) + "}"


#: name → its Lua definition, in the order they are put in front of a body.
TABLES: dict[str, str] = {
    "F": f"local F = {_names(JobField)}",
    "S": f"local S = {_names(Status)}",
    "FINAL": f"local FINAL = {_set(FINAL)}",
    "ENTRY_JOB": f"local ENTRY_JOB = '{ENTRY_JOB}'",
    "B": f"local B = {_names(BatchField)}",
    "BS": f"local BS = {_names(BatchStatus)}",
    "BFINAL": f"local BFINAL = {_set(BATCH_FINAL)}",
    "FF": f"local FF = {_names(FileField)}",
    "D": f"local D = {_names(DeliveryField)}",
}
_USES = {name: re.compile(rf"(?<![\w.]){name}\b") for name in TABLES}
#: Every value a table above carries: what a body must not spell as a literal.
SCHEMA_NAMES = frozenset(
    str(m)
    for enum in (JobField, Status, BatchField, BatchStatus, FileField, DeliveryField)
    for m in enum
) | {ENTRY_JOB}


def uses(body: str) -> list[str]:
    """The prelude tables `body` refers to."""
    return [name for name, pattern in _USES.items() if pattern.search(body)]


def source(body: str) -> str:
    """The script as sent to Redis: the tables it uses, then the body."""
    return "\n".join([*(TABLES[name] for name in uses(body)), body])
