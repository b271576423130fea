"""The live status page: one self-contained HTML file that polls `/v1/health`.

It is shipped as package data (`api/static/status.html`) and read once per process.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["status"])


@cache
def page() -> bytes:
    """The page's bytes (inline CSS, JS and SVG charts; nothing fetched from elsewhere)."""
    return files("inferq.api").joinpath("static/status.html").read_bytes()


@router.get("/", include_in_schema=False)
@router.get("/status", include_in_schema=False)
async def status_page() -> HTMLResponse:
    """Queue depth, items/s, batch tokens vs. ceiling and device memory, live."""
    return HTMLResponse(page(), headers={"Cache-Control": "no-cache"})
