"""The docs stay true to the repository: generated parts current, links alive, names real.

Fast and offline: files are read and compared, nothing is started.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferq import configdoc
from inferq.shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 250

# `INFERQ_*` names the docs may mention that are not settings: the load test's own knobs,
# read by locustfile.py from the environment (checked below to still be there).
NOT_SETTINGS = {"INFERQ_LOCUST_MODEL", "INFERQ_LOCUST_API_KEY", "INFERQ_LOCUST_MAX_INPUTS"}
# ... and the one the `inferq submit` / `inferq get` client commands read (not a server's).
CLIENT_ENV = {"INFERQ_CLIENT_KEY"}

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_NAME = re.compile(r"\bINFERQ_[A-Z0-9_]*[A-Z0-9]")


def _prose(page: Path) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens,
    repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(2).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_configuration_page_is_generated_from_the_settings() -> None:
    page = ROOT / "docs" / "configuration.md"
    current = page.read_text(encoding="utf-8") if page.is_file() else ""
    assert current == configdoc.render(), (
        "docs/configuration.md is out of date with shared/settings.py: "
        f"run `{configdoc.REGENERATE}` from the repository root"
    )


MIN_DESCRIPTION_WORDS = 6


def _thin(descriptions: dict[str, str | None]) -> list[str]:
    """Settings whose description says too little to choose a value by."""
    return [n for n, d in descriptions.items() if len((d or "").split()) < MIN_DESCRIPTION_WORDS]


def test_every_setting_says_what_it_is_for() -> None:
    """Each setting's description (the configuration page's text) says what it trades off:
    at least a sentence, not a label."""
    thin = _thin({n: f.description for n, f in Settings.model_fields.items()})
    assert not thin, f"describe these settings in shared/settings.py: {thin}"
    assert _thin({"x": "Heartbeat period."}) == ["x"]  # the check can fail


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move detail into docs/"
    )
    text = "\n".join(lines)
    for command in ("make run", "make test", "make lint"):
        assert command in text, f"README.md no longer mentions `{command}`"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_in_the_repo(page: Path) -> None:
    broken = []
    for line in _prose(page):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_relative_to(ROOT) or not dest.exists():
                broken.append(f"{target}: no such file in the repository")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_inferq_name_in_the_docs_is_a_setting() -> None:
    settings = {f"INFERQ_{name.upper()}" for name in Settings.model_fields}
    unknown = {
        f"{page.relative_to(ROOT)}: {name}"
        for page in PAGES
        for name in _NAME.findall(page.read_text(encoding="utf-8"))
        if name not in settings and name not in NOT_SETTINGS | CLIENT_ENV
    }
    assert not unknown, f"not settings (renamed or removed?): {sorted(unknown)}"


def test_the_allow_list_names_only_what_the_load_test_reads() -> None:
    locustfile = (ROOT / "locustfile.py").read_text(encoding="utf-8")
    assert all(name in locustfile for name in NOT_SETTINGS)
    cli = (ROOT / "inferq" / "cli.py").read_text(encoding="utf-8")
    assert all(name in cli for name in CLIENT_ENV)


def _code_folders() -> list[str]:
    """Every folder of package code (a folder holding .py files), relative to the root."""
    roots = ("api", "worker", "shared", "inferq", "bench", "client")
    return sorted(
        str(d.relative_to(ROOT))
        for r in roots
        for d in [ROOT / r, *(ROOT / r).rglob("*")]
        if d.is_dir() and "__pycache__" not in d.parts and any(d.glob("*.py"))
    )


def test_the_code_map_names_every_folder_and_module() -> None:
    """docs/architecture.md's code map has a section for every folder of the package and a
    line for every module in it (and none for a module that is gone)."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    # One section per folder, headed "### `folder/`: ...", one table row per module.
    sections = dict(re.findall(r"^### `([\w/]+)/`[^\n]*\n(.*?)(?=^#|\Z)", page, re.M | re.S))
    folders = _code_folders()
    assert {"api/routes", "api/core", "worker/policy", "shared/lua"} <= set(folders)
    missing = [f"{folder}/" for folder in folders if folder not in sections]
    missing += [
        f"{folder}/{module.name}"
        for folder in folders
        for module in sorted((ROOT / folder).glob("*.py"))
        if module.name != "__init__.py" and f"| `{module.name}` |" not in sections.get(folder, "")
    ]
    assert not missing, f"add a line to docs/architecture.md's code map for: {missing}"
    stale = [
        f"{folder}/{name}"
        for folder, body in sections.items()
        for name in re.findall(r"^\| `([\w.]+\.py)` \|", body, re.M)
        if not (ROOT / folder / name).is_file()
    ]
    assert not stale, f"docs/architecture.md's code map names modules that are gone: {stale}"
