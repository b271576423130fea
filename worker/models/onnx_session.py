"""What every ONNX Runtime model here shares: the export cache, the session, the OOM mapping.

Cache: `<cache_dir>/<name>-<sha256(weights)[:16]>-v<export version>-<variant>.onnx`. The key
changes when the weights or the export code change; files are written to a temp name and
renamed, so two workers exporting at once never leave a half-written model. onnxruntime and
torch are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inferq.worker.models.base import DeviceOutOfMemory

log = logging.getLogger("inferq.worker")

# ORT reports allocation failures as a generic RuntimeException/Fail; only the text says OOM.
_ORT_OOM = re.compile(
    r"Failed to allocate|bad[_ ]alloc|out of memory|OUT_OF_MEMORY|BFCArena|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)


def file_digest(path: Path) -> str:
    """First 16 hex of the sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


def write_atomic(target: Path, write: Callable[[Path], Any]) -> None:
    """`write(tmp_path)` then rename onto `target`: readers see nothing or the whole file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cached_export(
    cache_dir: Path, name: str, weights: Path, version: int, export: Callable[[Path], None]
) -> Path:
    """The cached fp32 `.onnx` of `weights`, calling `export(tmp_path)` once if absent."""
    target = cache_dir / f"{name}-{file_digest(weights)}-v{version}-fp32.onnx"
    if not target.is_file():
        log.info("exporting %s to ONNX at %s (once per weights)", name, target)
        write_atomic(target, export)
    return target


def export_quietly(
    module: Any,
    example: tuple[Any, ...],
    target: Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_shapes: dict[str, Any],
) -> None:
    """torch.onnx.export (dynamo) to one file with weights inline, without its chatter."""
    import torch

    chatty = [logging.getLogger(n) for n in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [lg.level for lg in chatty]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        # The exporter warns, logs at INFO and prints progress about its own internals;
        # none of it is actionable here.
        warnings.simplefilter("ignore")
        for lg in chatty:
            lg.setLevel(logging.WARNING)
        try:
            program = torch.onnx.export(
                module,
                example,
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_shapes=dynamic_shapes,
                dynamo=True,
                external_data=False,
                verbose=False,
            )
        finally:
            for lg, level in zip(chatty, levels, strict=True):
                lg.setLevel(level)
    assert program is not None
    target.write_bytes(program.model_proto.SerializeToString())


def providers(device: str, gpu_mem_limit: int | None = None) -> list[Any]:
    import onnxruntime as ort

    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        log.warning(
            "device=%s but onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu); "
            "running on CPU",
            device,
        )
        return ["CPUExecutionProvider"]
    index = int(device.partition(":")[2] or 0)
    # kSameAsRequested: the arena grows by what a batch needs, not to the next power of two,
    # so device memory tracks the batch ceiling (and the calibration measures that).
    cuda: dict[str, Any] = {"device_id": index, "arena_extend_strategy": "kSameAsRequested"}
    if gpu_mem_limit:  # the worker's share of INFERQ_MEMORY_BUDGET (`memory.arena_limit_bytes`)
        cuda["gpu_mem_limit"] = gpu_mem_limit
    return [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]


def session(
    path: Path, device: str, intra_op_threads: int = 0, gpu_mem_limit: int | None = None
) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    # Spinning threads steal the cores the API and the event loop need between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(str(path), options, providers=providers(device, gpu_mem_limit))
    log.info("onnx model %s runs on %s", path.name, s.get_providers()[0])
    return s


def run_mapping_oom(session: Any, outputs: list[str], feed: dict[str, Any]) -> list[Any]:
    """`session.run`, with ORT's allocation failures raised as DeviceOutOfMemory."""
    try:
        return session.run(outputs, feed)  # type: ignore[no-any-return]
    except MemoryError as e:
        raise DeviceOutOfMemory(str(e)) from e
    except Exception as e:  # ORT raises its own pybind types; only the message tells OOM
        if _ORT_OOM.search(str(e)):
            raise DeviceOutOfMemory(str(e)) from e
        raise
