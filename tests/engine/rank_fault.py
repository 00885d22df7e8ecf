"""The engine's CLI with a fault injected into rank 1: it runs out of memory at the start of step 2.

A CPU cannot run out of GPU memory on cue; this injects the exception a CUDA OOM raises, on one rank
only, so the test can watch how the other rank and the job report it. Run under torchrun, like the engine.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from training.engine import __main__ as engine
from training.engine.common import StudioCallback
from training.engine.launch import this_rank


def inject_oom() -> None:
    step_begin = StudioCallback.on_step_begin

    def on_step_begin(self: StudioCallback, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 24 GiB")
        step_begin(self, args, state, control, **kwargs)

    StudioCallback.on_step_begin = on_step_begin  # type: ignore[method-assign]


if __name__ == "__main__":
    if this_rank().index == 1:
        inject_oom()
    sys.exit(engine.main())
