"""Tracing a torch module with TorchScript, checked against eager, for the built-in models.

An eager forward dispatches hundreds of ops from Python, each needing the GIL, so it crawls
whenever the worker's event loop runs Python beside it (measured on 2 cores: 211 -> 17
items/s for minilm at batch 16 with a busy Python thread); a traced forward is one call that
runs without the GIL, which is also what lets several batches run at once, one per core.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger("inferq.worker")


def trace_checked(
    eager: Any, example: tuple[Any, ...], check: tuple[Any, ...], tolerance: float
) -> tuple[Any, bool]:
    """(module, traced): the frozen trace of `eager` on `example` if it matches eager within
    `tolerance` on `check` (other shapes than the example), else `eager` with a warning."""
    import torch

    try:
        with warnings.catch_warnings(), torch.inference_mode():
            # Silenced: TracerWarnings (shape-dependent branches recorded as constants; checked
            # below on new shapes), torch.jit's own deprecation (torch.compile/export need a C++
            # toolchain at run time; if trace goes away this falls back to eager), and library
            # deprecation notices that only tracing reaches.
            warnings.simplefilter("ignore")
            traced = torch.jit.freeze(torch.jit.trace(eager, example, check_trace=False))
            diff = float((eager(*check) - traced(*check)).abs().max())
    except Exception as e:  # an unusual architecture: eager still works
        log.warning("TorchScript trace failed (%s: %s); running eager", type(e).__name__, e)
        return eager, False
    if diff > tolerance:
        log.warning("TorchScript trace differs from eager by %.2g; running eager", diff)
        return eager, False
    return traced, True
