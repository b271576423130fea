"""What one API process is made of: `ApiParts`, built once by `create_app` (`inferq.api.app`)
when the app starts, put on `app.state.parts`, and read, typed, by the routes' dependencies
(`routes.deps`) and the hot path (`routes.fast`). Nothing else builds a part."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import State

from inferq.api.batches.files import FileStore
from inferq.api.batches.leases import BatchLeases
from inferq.api.batches.store import BatchStore
from inferq.api.core.admission import Admission, ModelCatalog, RedisMemory
from inferq.api.core.listing import JobListing
from inferq.api.core.service import JobService
from inferq.api.protocols.oip.body import BodyBudget
from inferq.shared.metrics import ApiMetrics
from inferq.shared.producer import JobProducer, Notifier
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings


@dataclass(frozen=True, slots=True)
class ApiParts:
    settings: Settings
    api_keys: dict[bytes, str]  # key → tenant (INFERQ_API_KEYS)
    admin_keys: dict[bytes, str]  # key → operator (INFERQ_ADMIN_KEYS)
    metrics: ApiMetrics
    queue: JobProducer
    registry: WorkerRegistry
    notifier: Notifier
    catalog: ModelCatalog
    admission: Admission
    memory: RedisMemory
    jobs: JobService
    listing: JobListing
    files: FileStore
    batches: BatchStore
    leases: BatchLeases
    oip_bodies: BodyBudget  # request bytes the OIP routes hold at once

    def tenants(self) -> list[str]:
        """Every tenant INFERQ_API_KEYS names ('' alone when the API is open)."""
        return sorted(set(self.api_keys.values())) or [""]


def parts_of(state: State) -> ApiParts:
    """The process's parts, from `app.state` (set by `create_app` as the app starts)."""
    parts: ApiParts = state.parts
    return parts
