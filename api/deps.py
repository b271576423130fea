"""Dependency aliases so route signatures stay short."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.service import JobService
from shared.settings import Settings


def _jobs(request: Request) -> JobService:
    return request.app.state.jobs


def _settings(request: Request) -> Settings:
    return request.app.state.settings


Jobs = Annotated[JobService, Depends(_jobs)]
Config = Annotated[Settings, Depends(_settings)]
