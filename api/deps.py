"""Dependency aliases so route signatures stay short (async: no threadpool hop per request)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from inferq.api.service import JobService
from inferq.shared.settings import Settings


async def _jobs(request: Request) -> JobService:
    return request.app.state.jobs


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


Jobs = Annotated[JobService, Depends(_jobs)]
Config = Annotated[Settings, Depends(_settings)]
