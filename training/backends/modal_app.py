"""The Modal app that runs the engine. Imports no Django: this module is what runs in Modal's container.

Deploy it once per Modal workspace/environment, from the repository root:

    modal deploy training/backends/modal_app.py        (app "studio-engine")

The image installs the trainer stack at the Studio's pins and carries the engine's own source
(training/engine), so the job runs the Studio's version of the engine. The Studio spawns
`run_engine` (preemptible: spot prices) or `run_engine_on_demand` (non-preemptible) with the GPU
the run asked for (`with_options(gpu=...)`) and keeps the call id; the body runs the engine on its
spec, streams its output to Modal's logs and returns the exit and the last 200 log lines.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import modal

APP_NAME = "studio-engine"
FUNCTION_SPOT = "run_engine"
FUNCTION_ON_DEMAND = "run_engine_on_demand"
LOG_TAIL_LINES = 200
JOB_TIMEOUT_SECONDS = 24 * 3600
_HERE = Path(__file__).resolve()
# In this checkout: the repository root. In Modal's container the module sits elsewhere and the
# engine comes from the image (REMOTE_ROOT).
REPO_ROOT = _HERE.parents[2] if len(_HERE.parents) > 2 else _HERE.parent
REMOTE_ROOT = "/root/studio"
# The trainer stack, at the Studio's pins (requirements.txt; a test keeps them equal to it and to
# connections.ENGINE_PACKAGES — this module cannot import that one in Modal's container).
ENGINE_PACKAGES = (
    "torch==2.13.0", "transformers==5.24.0", "trl==1.16.0", "peft==0.21.2", "datasets==5.2.0",
    "accelerate==1.15.0", "tokenizers==0.23.3", "huggingface-hub==2.4.0", "safetensors==0.8.0",
    "bitsandbytes==0.50.2", "requests==2.34.2",
)
ENV_ALLOW_LIST = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "HF_HOME",
                  "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                  "PYTORCH_CUDA_ALLOC_CONF")

image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install(*ENGINE_PACKAGES)
    .add_local_file(REPO_ROOT / "training" / "__init__.py", f"{REMOTE_ROOT}/training/__init__.py")
    .add_local_dir(REPO_ROOT / "training" / "engine", f"{REMOTE_ROOT}/training/engine", ignore=["__pycache__", "*.pyc"])
)
app = modal.App(APP_NAME, image=image)


def engine_root() -> Path:
    """Where `training.engine` is importable from: the image's copy, or this checkout (.local())."""
    return Path(REMOTE_ROOT) if Path(REMOTE_ROOT, "training", "engine").is_dir() else REPO_ROOT


def engine_argv(spec_path: str, spec: dict) -> list[str]:
    """The engine's command for this spec (torchrun, one process a GPU, for a data-parallel run), by
    the engine's own rule: the image carries training/engine, which this module finds on engine_root()."""
    root = str(engine_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    from training.engine.launch import engine_argv as argv_for

    return argv_for(sys.executable, spec_path, str(spec.get("method")), spec.get("compute"))


def run_engine_body(spec: dict, workdir: str | None = None) -> dict:
    """Run one attempt of the engine on `spec`; return {"returncode", "signal", "log_tail"}.

    The engine's output goes to this process's stdout (Modal's logs) as it comes; a SIGTERM (a
    cancelled call) is passed on so the engine flushes its buffered reports first.
    """
    directory = Path(workdir or tempfile.mkdtemp(prefix="studio-run-"))
    directory.mkdir(parents=True, exist_ok=True)
    spec = dict(spec)
    spec["output_dir"] = spec.get("output_dir") or str(directory / "output")
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {name: os.environ[name] for name in ENV_ALLOW_LIST if name in os.environ}
    env.update(PYTHONPATH=str(engine_root()), PYTHONUNBUFFERED="1")
    child = subprocess.Popen(engine_argv(str(spec_path), spec), cwd=engine_root(), env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    except ValueError:
        pass  # not the main thread (.local() from a worker thread): nothing to forward
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    try:
        assert child.stdout is not None  # stdout=PIPE
        for raw in child.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            print(line, flush=True)
        returncode = child.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return {"returncode": returncode if returncode >= 0 else None, "signal": -returncode if returncode < 0 else None, "log_tail": list(tail)}


@app.function(name=FUNCTION_SPOT, timeout=JOB_TIMEOUT_SECONDS)
def run_engine(spec: dict) -> dict:
    return run_engine_body(spec)


@app.function(name=FUNCTION_ON_DEMAND, timeout=JOB_TIMEOUT_SECONDS, nonpreemptible=True)
def run_engine_on_demand(spec: dict) -> dict:
    return run_engine_body(spec)
