"""`python -m training.engine --spec run.json`: run one training attempt and report it to Studio.

Exit codes: 0 completed, 1 training failed (reported), 2 bad spec, 3 superseded (ingest said 401/403, or 409: its run ended),
4 completed but the Studio did not take the last reports in time (they are in output_dir/undelivered-reports.jsonl),
143 stopped by SIGTERM after flushing.

Whatever the exit, reports the Studio did not take before the final drain ran out go to
output_dir/undelivered-reports.jsonl (reporter.SPOOL_NAME), for the Studio to deliver when it sees the job end.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from typing import Any

from .environments import PackageError
from .launch import DATA_PARALLEL_METHODS, Rank, die_with_parent, failure_of_another_rank, failure_path, gpu_count, this_rank
from .reporter import SPOOL_NAME, UNDELIVERED_EXIT, RankReporter, Reporter, Superseded, write_spool
from .spec import Spec, SpecError, heartbeat_interval, heartbeat_timeout, load_spec

SIGTERM_GRACE_S = 4.0
# Libraries whose warnings belong in the run log (and so in error.log_tail) next to our own lines.
LIBRARY_LOGGERS = ("transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes")


class _ReporterLogHandler(logging.Handler):
    def __init__(self, reporter: Reporter) -> None:
        super().__init__(level=logging.WARNING)
        self.reporter = reporter
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        # The library's own handler already wrote it to stderr, which the backend captures.
        self.reporter.log(self.format(record), echo=False)


def _is_oom(exc: BaseException) -> bool:
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is always there in the trainer image
        pass
    return "CUDA out of memory" in str(exc) or isinstance(exc, MemoryError)


def oom_message(spec: Spec, exc: BaseException, reporter: Reporter) -> str:
    """Seed 000's `oom` row points at the lever: the estimate and what to change, in the same words
    as the fit check before START (fit.py), computed from this run's spec."""
    # torch's message goes on about allocator settings; what was asked for is in its first two sentences.
    head = ". ".join(str(exc).split(". ")[:2]).strip().rstrip(".")
    try:
        from . import fit

        gpu = fit.visible_gpu()
        shape = fit.shape_of_model(spec.base_model, spec.base_model_revision)
        # The same decision build_config made, so the estimate describes the run that ran out.
        checkpointing, _ = fit.decide_checkpointing(spec.method, spec.config, spec.base_model, spec.base_model_revision, "cuda" if gpu else "cpu")
        advice = fit.oom_advice(spec.method, spec.config, shape, card_bytes=gpu[1] if gpu else None, gpu_name=gpu[0] if gpu else None,
                                checkpointing=checkpointing or gpu is None)
    except Exception as advice_error:  # noqa: BLE001 - the failure must be reported even if the advice fails
        reporter.log(f"oom: no estimate ({advice_error})")
        advice = "drop to a smaller base, pick a GPU with more memory, or shrink max_length / max_response_length"
    return f"{type(exc).__name__}: {head}. Out of memory: {advice}"


def _install_sigterm(reporter: Reporter, spec: Spec, rank: Rank) -> None:
    def on_term(signum: int, frame: Any) -> None:
        # STOP signals twice (its request at once, its task after): one flush, and the second waits its turn.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = 143
        try:
            # torchrun stops rank 0 this way when another rank failed: that failure is the run's outcome.
            failure = _failure_of_another_rank(spec, rank)
            if failure is not None:
                code = 1
                reporter.log(f"stopping: {failure.get('message')}")
                reporter.status("failed", failure)
            else:
                reporter.log("SIGTERM: flushing reports and stopping")
            close_reporter(reporter, spec, SIGTERM_GRACE_S)
        finally:
            # os._exit: no unwinding through half-finished torch/trainer state, and no atexit surprises.
            sys.stdout.flush()
            os._exit(code)

    signal.signal(signal.SIGTERM, on_term)


def _failure_of_another_rank(spec: Spec, rank: Rank) -> dict[str, Any] | None:
    return failure_of_another_rank(spec.output_dir, rank) if rank.world > 1 and rank.is_main else None


def log_parallelism(spec: Spec, reporter: Reporter, device_kind: str, rank: Rank) -> None:
    """Say how many processes train, so a run that paid for N GPUs can see whether it uses them."""
    if rank.world > 1:
        unit = "GPU" if device_kind == "cuda" else "CPU process"
        reporter.log(f"data parallel: world size {rank.world}, one {unit} each; a step's global batch is "
                     f"per_device_train_batch_size x gradient_accumulation_steps x {rank.world}")
        return
    gpus = gpu_count(spec.compute)
    if gpus > 1 and spec.method not in DATA_PARALLEL_METHODS:
        reporter.log(f"{spec.method.upper()} trains in one process on 1 GPU of the {gpus} this run asked for: "
                     "only SFT and DPO train data-parallel across GPUs in this version")


def run_spec(spec: Spec, reporter: Reporter, rank: Rank | None = None) -> None:
    """Dispatch to the method; raises on failure. Imported lazily so `--help` and spec errors are fast."""
    from .common import Context
    from .modeling import pick_device, seed_run

    rank = rank or Rank()
    # The engine is up and doing the run's work from here (loading the model and data, a capture, then
    # training): the run is running, and its duration counts all of it. Provisioning is the wait for a
    # machine or a slot before; a first step that takes minutes (GRPO's generation) is running too.
    reporter.stage("setup")
    reporter.status("running")
    device = pick_device(spec, rank)
    seed_run(spec)  # before anything draws a random number: data shuffles, an environment's prompts, the adapter
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    reporter.log(f"run {spec.run_id} attempt {spec.attempt}: {spec.method} on {device.kind} ({device.precision}), base {spec.base_model}{'@' + spec.base_model_revision[:12] if spec.base_model_revision else ''}")
    log_parallelism(spec, reporter, device.kind, rank)
    ctx = Context(spec=spec, reporter=reporter, device=device, rank=rank)
    if spec.method == "sft":
        from . import sft as method
    elif spec.method == "dpo":
        from . import dpo as method  # type: ignore[no-redef]
    elif spec.method == "grpo":
        from . import grpo as method  # type: ignore[no-redef]
    else:
        from . import distill as method  # type: ignore[no-redef]
    method.run(ctx)


def execute(spec: Spec, reporter: Reporter, rank: Rank | None = None) -> int:
    """Run one attempt with the engine's error contract; returns the process exit code."""
    reporter.start()
    handler = _ReporterLogHandler(reporter)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).addHandler(handler)
    try:
        return _execute(spec, reporter, rank or Rank())
    finally:
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).removeHandler(handler)


def final_drain_seconds(spec: Spec) -> float:
    """How long the last reports (the end status, the last steps and checkpoints) are retried before
    the engine exits: as long as the Studio waits for a heartbeat, so a Studio outage it would ride
    out loses none of them (30-60 s lost a whole run's reports when the Studio was down longer)."""
    return float(heartbeat_timeout(spec.config))


def close_reporter(reporter: Reporter, spec: Spec, timeout: float) -> bool:
    """Send the last reports within `timeout`; what the Studio did not take goes, in order, to the
    spool file in the output folder instead of being lost with the process. True if all was sent."""
    delivered = reporter.close(timeout=timeout)
    batches = reporter.take_undelivered()
    if batches:
        path = spec.output_dir / SPOOL_NAME
        try:
            write_spool(path, batches)
            print(f"reporter: the Studio did not take the last {len(batches)} reports in time; they are in {path}, "
                  "which the Studio delivers when it sees the job end", file=sys.stderr, flush=True)
        except OSError as exc:  # a full disk: say what was lost rather than fail the exit
            print(f"reporter: the Studio did not take the last {len(batches)} reports in time, and they could not be "
                  f"written to {path} ({exc}): they are lost", file=sys.stderr, flush=True)
    return delivered


def leave_process_group() -> None:
    """End this process's part in the run's process group once training is done. Left to the
    interpreter's exit, gloo's worker threads can outlive it and abort the process (SIGABRT,
    "terminate called without an active exception"): torchrun then failed a run that had completed.
    Only after success: a rank that failed may leave peers inside a collective, and tearing down then
    can hang, so a failing rank just exits and torchrun ends the others."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is always there in the trainer image
        return
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _execute(spec: Spec, reporter: Reporter, rank: Rank) -> int:
    try:
        run_spec(spec, reporter, rank)
        leave_process_group()
    except Superseded as exc:
        reporter.log(f"stopped: {exc}")
        reporter.close(timeout=2.0)
        return 3
    except SpecError as exc:
        reporter.log(f"bad spec: {exc}")
        reporter.status("failed", {"code": "training_error", "message": str(exc), "log_tail": list(reporter.log_tail)})
        close_reporter(reporter, spec, 30.0)
        return 2
    except BaseException as exc:  # noqa: BLE001 - every failure must reach Studio before we exit
        if isinstance(exc, KeyboardInterrupt):
            raise
        for line in traceback.format_exc().splitlines():
            reporter.log(line)
        other = _failure_of_another_rank(spec, rank)
        tail = list(reporter.log_tail)
        if other is not None:  # this rank failed because another one did (a collective lost its peer)
            code, message, tail = str(other.get("code") or "training_error"), str(other.get("message")), list(other.get("log_tail") or tail)
        elif _is_oom(exc):
            code, message = "oom", oom_message(spec, exc, reporter)
        elif isinstance(exc, PackageError):  # a sentence naming the environment, what raised and where
            code, message = "training_error", str(exc)
        else:
            code, message = "training_error", f"{type(exc).__name__}: {exc}"
        reporter.status("failed", {"code": code, "message": message, "log_tail": tail})
        close_reporter(reporter, spec, final_drain_seconds(spec))
        return 1
    if reporter.superseded.is_set():
        reporter.close(timeout=2.0)
        return 3
    reporter.log("completed")
    reporter.status("completed")
    delivered = close_reporter(reporter, spec, final_drain_seconds(spec))
    if reporter.superseded.is_set():
        return 3
    return 0 if delivered else UNDELIVERED_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.engine", description=__doc__)
    parser.add_argument("--spec", required=True, help="path to the run spec JSON")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        print(f"bad spec: {exc}", file=sys.stderr, flush=True)
        return 2
    rank = this_rank()
    reporter = main_reporter(spec) if rank.is_main else RankReporter(rank.index, failure_path(spec.output_dir, rank))
    if rank.world > 1:
        die_with_parent()
    _install_sigterm(reporter, spec, rank)
    return execute(spec, reporter, rank)


def main_reporter(spec: Spec) -> Reporter:
    return Reporter(spec.ingest_url, spec.ingest_token, heartbeat_interval=heartbeat_interval(spec.config))


def exit_rank(code: int) -> None:
    """Leave a data-parallel rank's process at once, once its reports are closed and its output
    written. Interpreter teardown destroys torch's C++ objects (the DDP reducer still holding the
    gloo group after destroy_process_group, its worker threads) in no set order, and now and then
    aborts a rank that had completed (SIGABRT, "terminate called without an active exception"):
    torchrun then failed the run (CI saw it at stop 26, after destroy_process_group alone)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_code = main()
    if this_rank().world > 1:
        exit_rank(exit_code)
    raise SystemExit(exit_code)
