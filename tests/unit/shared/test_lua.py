"""One Lua convention: every script names fields, statuses and lanes only through the tables
`inferq.shared.lua` builds from the schema, and gets exactly the tables it uses."""

from __future__ import annotations

import re
from enum import StrEnum
from types import ModuleType

import pytest

from inferq.shared import lua
from inferq.shared.lua import batches, queue, webhooks
from inferq.shared.schema import (
    BATCH_FINAL,
    FINAL,
    BatchField,
    BatchStatus,
    DeliveryField,
    FileField,
    JobField,
    Status,
)

MODULES: tuple[ModuleType, ...] = (queue, batches, webhooks)
SCRIPTS = {
    f"{m.__name__.rsplit('.', 1)[-1]}.{name}": body
    for m in MODULES
    for name, body in vars(m).items()
    if name.isupper() and isinstance(body, str)
}
TABLES: dict[str, type[StrEnum]] = {
    "F": JobField,
    "S": Status,
    "B": BatchField,
    "BS": BatchStatus,
    "FF": FileField,
    "D": DeliveryField,
}


def test_every_script_module_is_covered() -> None:
    """A new module of scripts must be added to MODULES, or nothing here checks it."""
    from importlib.resources import files

    found = {p.name[:-3] for p in files("inferq.shared.lua").iterdir() if p.name.endswith(".py")}
    assert found - {"__init__"} == {m.__name__.rsplit(".", 1)[-1] for m in MODULES}
    assert len(SCRIPTS) >= 16


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_script_spells_a_schema_name_as_a_literal(name: str) -> None:
    quoted = set(re.findall(r"'([A-Za-z_]+)'", SCRIPTS[name]))
    spelled = quoted & lua.SCHEMA_NAMES
    assert not spelled, f"{name} hard-codes {sorted(spelled)}: use the prelude's tables"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_table_reference_names_a_schema_member(name: str) -> None:
    body = SCRIPTS[name]
    for table, enum in TABLES.items():
        members = {m.name.lower() for m in enum}
        for ref in re.findall(rf"(?<![\w.]){table}\.([a-z_]+)", body):
            assert ref in members, f"{name}: {table}.{ref} is not a {enum.__name__}"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_built_script_holds_literals_and_only_the_sets_it_tests(name: str) -> None:
    """Names become literals when the script is built (nothing per call); the membership
    sets it uses (FINAL, BFINAL) are defined in front, and no others."""
    body = SCRIPTS[name]
    built = lua.source(body)
    assert not re.search(r"(?<![\w.])(F|S|B|BS|FF|D)\.[a-z_]+", built), built
    assert "ENTRY_JOB" not in built
    defined = set(re.findall(r"^local (\w+) = \{\[", built, re.M))
    assert defined == {s for s in ("FINAL", "BFINAL") if s in lua.uses(body)}
    for table, enum in TABLES.items():  # each reference became its member's value
        for ref in set(re.findall(rf"(?<![\w.]){table}\.([a-z_]+)", body)):
            assert f"'{enum[ref.upper()].value}'" in built


def test_an_unknown_member_stops_the_build() -> None:
    with pytest.raises(ValueError, match="JobField has no NOPE"):
        lua.source("return F.nope")


def test_every_member_becomes_its_literal_and_the_sets_hold_every_final_state() -> None:
    for table, enum in TABLES.items():
        for m in enum:
            assert lua.source(f"return {table}.{m.name.lower()}") == f"return '{m.value}'"
    for st in FINAL:
        assert f"['{st}']=true" in lua.SETS["FINAL"]
    for st in BATCH_FINAL:
        assert f"['{st}']=true" in lua.SETS["BFINAL"]
    assert set(lua.SETS) == {"FINAL", "BFINAL"}


def test_a_bare_literal_would_be_caught() -> None:
    """The check above can fail: a body that spells a field is refused."""
    quoted = set(re.findall(r"'([A-Za-z_]+)'", "redis.call('HGET', KEYS[1], 'status')"))
    assert quoted & lua.SCHEMA_NAMES == {"status"}
