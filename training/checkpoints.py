"""Checkpoint actions: resume a child run from a saved step, merge a LoRA checkpoint into its base."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from datahub.refs import PINNED_THINGS, gone_pins, hub_env, is_hub_ref, pin_deleted
from datahub.services import create_run_branch, kept_run_repo, record_checkpoint, run_branch_gone
from studio import crypto
from studio.errors import BadRequest, Conflict, Finding, counted
from studio.queue import Sending, send_after_commit
from training.backends.local import REPO_ROOT, checkpoint_dir, engine_env
from training.compute import trained_precision
from training.methods.base import MAX_STEPS, lora_enabled
from training.models import Checkpoint, TrainingRun
from training.services import (
    MERGE_TOKEN_PREFIX,
    add_log,
    attempt_pinned,
    attempt_record,
    attempt_settings,
    locked_run,
    pinned_attempt_settings,
    require_training_plan,
)

log = logging.getLogger(__name__)
RESUMABLE_KINDS = ("checkpoint",)
MERGE_TIMEOUT_SECONDS = 3600
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def merge_mark_expired() -> datetime:
    """A merge asked for before this has timed out, or its task never ran: the mark no longer counts."""
    return timezone.now() - timedelta(seconds=MERGE_TIMEOUT_SECONDS + 600)


def merging(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """The checkpoints whose merge was asked for and has not finished (or failed) yet."""
    expired = merge_mark_expired()
    return [c for c in checkpoints if c.kind in RESUMABLE_KINDS and c.merge_requested_at and c.merge_requested_at > expired]


def merging_steps(checkpoints: list[Checkpoint]) -> set[int]:
    """The steps whose merge was asked for and has not finished (or failed) yet."""
    return {c.step for c in merging(checkpoints)}


def checkpoint_of(run: TrainingRun, step: int, attempt: int | None = None) -> Checkpoint:
    """Saved step `step` of `run` that can be resumed or merged: the one `attempt` saved, or without
    it the newest attempt's. Each attempt saves into its own folder, so a step that a restarted run
    saved again is two checkpoints with different weights: `attempt` picks one."""
    saved = Checkpoint.objects.filter(run=run, step=step, kind__in=RESUMABLE_KINDS)
    checkpoint = (saved.filter(attempt=attempt) if attempt is not None else saved).order_by("-attempt", "-id").first()
    if checkpoint is not None:
        return checkpoint
    attempts = sorted(set(saved.values_list("attempt", flat=True)))
    if attempt is None or not attempts:
        raise BadRequest(f"Run {run.pk} has no saved checkpoint at step {step}.", [Finding("step", "pick a step listed under Checkpoints (kind checkpoint)")])
    raise BadRequest(f"Attempt {attempt} of run {run.pk} saved no checkpoint at step {step}.",
                     [Finding("attempt", f"step {step} was saved by {counted(len(attempts), 'attempt')}, "
                                         f"{', '.join(map(str, attempts))}: give one of those, or leave attempt out for the newest")])


@transaction.atomic
def resume_run(run: TrainingRun, step: int, user, attempt: int | None = None) -> TrainingRun:
    """A new queued run that continues from saved step `step` of `attempt` (the newest attempt that
    saved it when None): weights, optimizer, scheduler and RNG state, with the settings that attempt
    trained with (its base model, dataset, config and compute: the run may have been edited before a
    later attempt), each Data Hub ref at the commit that attempt trained on (`student@<commit id>`),
    so it trains on the same model and data after their branches move or are deleted. Lineage
    records the parent run and the checkpoint. A max_steps that ends at or before the step (the
    parent's last step, resumed) becomes step + max_steps, so the child trains as many steps again
    instead of being refused at START. The plan gate comes first:
    resuming creates a run, and 402 precedes a bad step's 400 as it precedes create's."""
    require_training_plan(run.project)
    run = locked_run(run)  # a DELETE of the parent waits, then sees the child (or this finds it gone)
    checkpoint = checkpoint_of(run, step, attempt)
    gone = resume_blockers(run, checkpoint.attempt)
    if gone:
        raise Conflict(f"Step {checkpoint.step} of run #{run.pk} cannot be resumed: a resumed run trains on the commits it trained on, "
                       "and some went with their deleted repo.", gone)
    settings = pinned_attempt_settings(run, checkpoint.attempt)
    settings["config"] = steps_past(settings["config"] or {}, checkpoint.step)
    child = TrainingRun.objects.create(
        project=run.project, experiment=run.experiment, created_by=user, name=f"{run.name} (from step {checkpoint.step})"[:200],
        method=run.method, parent=run, resume_checkpoint=checkpoint, **settings,
    )
    create_run_branch(child)
    return child


def resume_blockers(run: TrainingRun, attempt: int) -> list[Finding]:
    """Why no run can resume from a step that attempt `attempt` of `run` saved ([] when one can): a
    resumed run reads each Data Hub ref at the commit that attempt was pinned to (resume_run), and a
    commit deleted with its repo is gone for good, so the new run could never start."""
    return [Finding(field, f"{pin_deleted(pin)}: train a new run from another {PINNED_THINGS.get(field, 'dataset')} instead")
            for field, pin in gone_pins(attempt_pinned(run, attempt)).items()]


def merge_blocker(run: TrainingRun, attempt: int, branch_kept: bool) -> str:
    """Why a step that attempt `attempt` of `run` saved cannot be merged ("" when it can): the merged
    model is committed to the run's branch (`branch_kept`: kept_run_repo found it), and the merge loads
    the base at the commit that attempt pinned (merge_base). With either deleted, the merge could
    only fail in the worker, where only the run's log says so."""
    if not branch_kept:
        return (f"{run_branch_gone(run)}, so the merged model would have nowhere to be committed: resume from the step instead "
                "(the new run has a branch of its own, and its saved steps can be merged)")
    base = gone_pins({"base_model": attempt_pinned(run, attempt).get("base_model")})
    if base:
        return f"{pin_deleted(base['base_model'])}, so the base the adapter was trained on is gone"
    return ""


def steps_past(config: dict, step: int) -> dict:
    """`config` for a run resumed from `step`: a max_steps at or below it trained nothing (START's
    check_resumable refuses it), so it becomes step + max_steps, within MAX_STEPS."""
    max_steps = config.get("max_steps")
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or not 0 < max_steps <= step or step >= MAX_STEPS:
        return config
    return {**config, "max_steps": min(step + max_steps, MAX_STEPS)}


@transaction.atomic
def request_merge(run: TrainingRun, checkpoint: Checkpoint) -> Sending:
    """Queue the merge of a LoRA checkpoint into the base; the merged weights are committed to the
    run's branch as a `merged` checkpoint. Under the run's row lock, as a DELETE checks for merges.
    Its `.unsent` (read on return) is True when the task queue could not be reached: then nothing is
    marked Merging…, and the caller says MERGE_UNSENT."""
    from training.tasks import merge_checkpoint

    locked_run(run)
    if not lora_enabled(attempt_settings(run, checkpoint.attempt)["config"]):  # the step's attempt's: the run may have been edited since
        raise BadRequest("Only a LoRA run's checkpoints can be merged.", [Finding("step", "this run trains all weights: its checkpoints are already full models")])
    blocked = merge_blocker(run, checkpoint.attempt, kept_run_repo(run) is not None)
    if blocked:
        raise Conflict(f"Step {checkpoint.step} of run {run.pk} (attempt {checkpoint.attempt}) cannot be merged: {blocked}.")
    # Per attempt: a step that a restarted run saved again holds other weights, and merges apart.
    if Checkpoint.objects.filter(run=run, kind="merged", step=checkpoint.step, attempt=checkpoint.attempt).exists():
        raise Conflict(f"Step {checkpoint.step} of run {run.pk} (attempt {checkpoint.attempt}) is already merged: its merged checkpoint is listed under Checkpoints.")
    # The in-flight mark the Checkpoints tab shows ("Merging…") and that refuses a second request;
    # merge() clears it when it ends either way, and it expires should the task never run.
    marked = Checkpoint.objects.filter(Q(merge_requested_at__isnull=True) | Q(merge_requested_at__lte=merge_mark_expired()), pk=checkpoint.pk).update(merge_requested_at=timezone.now())
    if not marked:
        raise Conflict(f"Step {checkpoint.step} of run {run.pk} is being merged: it appears under Checkpoints as merged when done.")
    return send_after_commit(merge_checkpoint, checkpoint.pk, on_unsent=lambda: Checkpoint.objects.filter(pk=checkpoint.pk).update(merge_requested_at=None))


MERGE_UNSENT = "The task queue (Redis) cannot be reached, so the merge was not started: press Merge again once it is back."


def branch_gone_for_merge(run: TrainingRun, checkpoint: Checkpoint) -> bool:
    """Whether the merge fails because the run's branch, where its result is committed, went with its
    repo (logged on the run): a merge is not what makes the repo again."""
    if kept_run_repo(run) is not None:
        return False
    add_log(run, f"[studio] merge of step {checkpoint.step} failed: {run_branch_gone(run)}, so the merged model has nowhere to be committed")
    return True


def die_with_parent(parent: int) -> None:
    """preexec_fn of the merge process (`parent`: the worker's pid): the kernel SIGKILLs it when the
    worker that started it dies (Linux's PR_SET_PDEATHSIG), so a merge lost with its worker (and run
    again, acks_late) does not go on beside the new one, writing the same folder with the model twice
    in memory."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the worker died before prctl took effect
        os._exit(1)


def merge(checkpoint_id: int) -> Checkpoint | None:
    """Run the engine's merge in its own process (the worker never holds model weights)."""
    checkpoint = Checkpoint.objects.select_related("run", "run__project").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        return None
    try:
        return _merge(checkpoint)
    finally:
        Checkpoint.objects.filter(pk=checkpoint.pk).update(merge_requested_at=None, merge_token_hash="")


def merge_base(checkpoint: Checkpoint) -> tuple[list[str], dict[str, str]] | None:
    """The merge's --base arguments and environment: the model the adapter was trained on, by the
    settings of the step's attempt. A Data Hub base loads as the engine loaded it to train
    (datahub.refs.engine_inputs): its repo id at the commit that attempt pinned, from Studio's /hub,
    with a token that reads that commit while this merge runs (datahub.hf_api.merge_reader); the ref
    itself is not a name transformers can load, and its branch may have moved or gone since.
    None, logged on the run, when the attempt kept no commit for a Data Hub base."""
    run = checkpoint.run
    trained = attempt_record(run, checkpoint.attempt)
    if not is_hub_ref(trained.base_model):
        return ["--base", trained.base_model], {}
    pin = (trained.pinned or {}).get("base_model")
    if not pin or pin.get("ref") != trained.base_model:
        add_log(run, f"[studio] merge of step {checkpoint.step} failed: base_model {trained.base_model} is a Data Hub ref, and attempt "
                     f"{checkpoint.attempt} kept no commit it was pinned to, so which weights the adapter was trained on is not known; "
                     "start the run again, and merge a step its new attempt saves")
        return None
    token = crypto.new_token(MERGE_TOKEN_PREFIX)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(merge_token_hash=crypto.hash_token(token))
    return ["--base", pin["repo"], "--revision", pin["commit"]], hub_env(token)


def merge_precision(checkpoint: Checkpoint) -> str:
    """The precision the step's attempt trained in. The merge loads the base in it, so the merged weights
    are the base + adapter that attempt trained: its worker's GPU alone made an fp32 run's merge bf16."""
    settings = attempt_settings(checkpoint.run, checkpoint.attempt)
    return trained_precision(settings["config"] or {}, settings["compute"] or {})


def _merge(checkpoint: Checkpoint) -> Checkpoint | None:
    run = checkpoint.run
    adapter = checkpoint_dir(checkpoint)
    if adapter is None:
        add_log(run, f"[studio] merge of step {checkpoint.step} not done: its checkpoint is not a folder in the run's own folder on this machine")
        return None
    if branch_gone_for_merge(run, checkpoint):
        return None
    out = adapter.parent / f"merged-step-{checkpoint.step}"
    base = merge_base(checkpoint)
    if base is None:
        return None
    base_args, hub = base
    command = [sys.executable, "-m", "training.engine.merge", *base_args, "--adapter", str(adapter), "--out", str(out),
               "--precision", merge_precision(checkpoint)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=engine_env(hub), capture_output=True, text=True, timeout=MERGE_TIMEOUT_SECONDS,
                          preexec_fn=partial(die_with_parent, os.getpid()))
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        add_log(run, f"[studio] merge of step {checkpoint.step} failed ({how})" + (": " + " | ".join(tail) if tail else "; merge it again"))
        return None
    if branch_gone_for_merge(run, checkpoint):  # the repo was deleted while the merge ran
        return None
    merged = Checkpoint.objects.create(run=run, attempt=checkpoint.attempt, step=checkpoint.step, kind="merged", path=str(out), requested=True)
    record_checkpoint(run, merged)
    add_log(run, f"[studio] step {checkpoint.step} merged into the base: {out}")
    return merged
