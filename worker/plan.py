"""Where a worker runs and how many batches it runs at once: the device and thread plan.

Pure of Redis; torch is imported only when it is installed (and only to look for CUDA or
to set its thread count).
"""

from __future__ import annotations

import importlib.util
import logging
import os

from inferq.shared.settings import ModelSpec, Settings
from inferq.worker.models.base import Model

log = logging.getLogger("inferq.worker")


def resolve_device(requested: str) -> str:
    """'auto' → 'cuda' when torch sees a GPU, else 'cpu'; torch is only imported if present."""
    if requested != "auto":
        return requested
    if importlib.util.find_spec("torch") is None:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_backend(requested: str, device: str, target: str) -> str:
    """'auto' → ONNX Runtime for minilm on a CPU when onnxruntime is installed, else torch.

    Measured on this 2-core CPU: minilm one item at a time 132 items/s on ONNX Runtime fp32
    against 61 on traced torch, vectors at cosine 1.0000. Not measured: efficientnet-lite0 on
    ONNX Runtime in the stack, and any GPU, so those stay on torch until they are."""
    if requested != "auto":
        return requested
    on_cpu = device.startswith("cpu")
    if on_cpu and target == "minilm" and importlib.util.find_spec("onnxruntime") is not None:
        return "onnx"
    return "torch"


def resolve_dtype(requested: str, device: str, target: str) -> str:
    """'auto' → float16 for the built-in minilm on CUDA (vectors at cosine ≥ 0.9999 against
    float32 on the bench corpora: tests/integration/test_minilm.py), float32 otherwise (a
    CPU runs float16 slower than float32)."""
    if requested != "auto":
        return requested
    return "float16" if device.startswith("cuda") and target == "minilm" else "float32"


# Auto mode runs at most this many batches at once on a CPU; the rest of the cores go to each
# batch's intra-op threads. Only measured on 2 cores: more streams on a big CPU is a guess.
MAX_AUTO_STREAMS = 4


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def runs_without_gil(spec: ModelSpec, settings: Settings) -> bool:
    """Built-in minilm on ONNX Runtime, or on torch traced: one call per batch, GIL released."""
    built_in = spec.target in ("minilm", "efficientnet-lite0")
    return built_in and (settings.backend == "onnx" or settings.torchscript)


def thread_plan(settings: Settings, device: str, spec: ModelSpec) -> tuple[int, int]:
    """(batches at once, threads per batch); 0 threads per batch = the runtime's default.

    Auto on a CPU, for a model whose batch runs without the GIL: one batch per core, one
    thread each. Measured on 2 cores (traced minilm, batch 16, short sentences): two batches
    on one thread each did 288 items/s against 216 for one batch on two threads, and with
    another process using 30 % / 60 % of a core, 240 / 220 against 156 / 116: a preempted
    OpenMP thread stalls every op of a two-thread batch at its barrier, while two single-
    thread batches lose only the preempted one's share. A GPU, or a model that may hold the
    GIL, gets one batch at a time.
    """
    cores = cpu_cores()
    streams = settings.model_threads
    if not streams:
        parallel = device == "cpu" and runs_without_gil(spec, settings)
        streams = min(cores, MAX_AUTO_STREAMS) if parallel else 1
    intra = settings.intra_op_threads
    if not intra and device == "cpu" and streams > 1:
        intra = max(1, cores // streams)
    return streams, intra


def settle_plan(model: Model, settings: Settings, plan: tuple[int, int]) -> tuple[int, int]:
    """The auto plan assumed a GIL-free model; if the trace fell back to eager, run one batch
    at a time on every core instead (eager batches side by side fight over the GIL)."""
    streams = plan[0]
    if settings.model_threads or streams == 1 or getattr(model, "traced", True):
        return plan
    import torch

    torch.set_num_threads(cpu_cores())
    log.warning("the model runs eager (not traced): one batch at a time instead of %d", streams)
    return 1, 0
