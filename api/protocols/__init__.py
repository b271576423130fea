"""One adapter per protocol: what a request body means and what a job answers, without HTTP.

- `v1`: inferq's own `/v1/jobs` and `/v1/infer` (JSON bodies; multipart stays in the route);
- `embeddings`: OpenAI's `/v1/embeddings` (and its compact vectors, `vectors`);
- `oip`: the Open Inference Protocol (`/v2`).

Each adapter does the same steps, `parse` → `bind` → `submission` → (`refusal`) → `answer`:
the routes, the hot path (`routes.fast`) and batch lines (`batches.lines`) all call these,
so a request reads the same whichever way it came. An adapter never imports FastAPI.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from inferq.api.core.admission import ModelCatalog
from inferq.api.core.decode import Submission
from inferq.shared.errors import RequestError
from inferq.shared.jobs import Job


class Answer(NamedTuple):
    """What the endpoint answers, before HTTP: the route sends it, a batch line records it."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] | None = None


class Adapter(Protocol):
    """One endpoint's request handling, as its route does it, without HTTP."""

    def parse(self, body: bytes) -> Any:
        """The request, or the `Answer` the endpoint gives a body it refuses."""

    async def bind(self, req: Any, catalog: ModelCatalog) -> Any:
        """What the endpoint checks against its model's declaration before submitting (the
        only step that may read Redis, through `catalog`): the request, or its `Answer`."""

    def submission(self, req: Any, tenant: str, **fields: Any) -> Submission: ...

    def refusal(self, e: RequestError) -> Answer: ...

    def answer(self, req: Any, job: Job) -> Answer: ...
