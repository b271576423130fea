"""Both sides of the queue in one object, for tests and scripts that play the API and a worker
in one process (submit, then claim and finish). Production code holds one side only: the API
a `JobProducer`, a worker a `JobConsumer`."""

from __future__ import annotations

from inferq.shared.consumer import JobConsumer
from inferq.shared.producer import JobProducer


class JobQueue(JobProducer, JobConsumer):
    """`JobProducer` and `JobConsumer` over one client (each registers its own scripts)."""
