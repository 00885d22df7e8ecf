"""The only functions that create, change, start and stop training runs.

START commits, then (on_commit) a Celery task claims the run with a conditional UPDATE
(queued → provisioning) and submits it to its backend; a second copy of the task claims nothing.
What happens to a run after its submit (polls, deadlines, retries, cost) is training.reconciler's,
which builds on this module and is never imported by it.
"""
from __future__ import annotations

import logging
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from datahub.refs import engine_inputs, gone_pins, pin_refs, refs_at_pins, trained_from
from datahub.services import create_run_branch, kept_run_repo, remove_empty_run_branch
from environments.services import job_environment, judge_env
from experiments.models import Experiment
from experiments.services import default_experiment, find_experiment
from studio import audit, crypto
from studio.errors import BadRequest, Conflict, Finding, NotFound, PaymentRequired, Unprocessable, counted
from studio.models import AuditEvent, Project
from studio.queue import send, send_after_commit
from training import status as status_service
from training.backends import get_backend
from training.backends.base import BackendError, BackendUnavailable, JobSpec
from training.backends.local import checkpoint_dir, job_lingers, output_dir, relocated
from training.compute import accelerators_of
from training.methods.base import Draft
from training.models import (
    ACTIVE_STATUSES,
    Checkpoint,
    ErrorCode,
    IngestBatch,
    LogLine,
    MetricPoint,
    Rollout,
    RunAttempt,
    Status,
    TrainingRun,
)
from training.validation import method_or_400, name_findings, start_findings, validate_draft

log = logging.getLogger(__name__)
INGEST_TOKEN_PREFIX = "ing"
MERGE_TOKEN_PREFIX = "mrg"  # a merge's read of its base model from /hub (training.checkpoints.merge_base)
PATCHABLE = ("name", "base_model", "dataset", "config", "compute")


# ---- plan gating (402) -------------------------------------------------------------------------

def require_training_plan(project: Project) -> None:
    plan = project.plan
    if plan is None or not plan.includes_training:
        name = f"the {plan.name} plan" if plan else "no plan"
        raise PaymentRequired(f"Project {project.slug} is on {name}, which does not include training: ask a Studio administrator for a plan with training (Settings → Billing shows the plan).")


def require_plan_gpus(project: Project, run: TrainingRun) -> None:
    """The plan's GPUs per run: a limit on what this run asks for (compute.accelerators), which the
    run's other findings for that many GPUs would follow from."""
    plan = project.plan
    accel = accelerators_of(run.compute)
    if accel.count > plan.max_gpus_per_run:
        raise PaymentRequired(
            f"The {plan.name} plan allows {counted(plan.max_gpus_per_run, 'GPU')} per run and this run asks for {accel.count}: ask for fewer, or ask a Studio administrator for a larger plan (Settings → Billing shows the plan).",
            [Finding("compute.accelerators", f"ask for at most {counted(plan.max_gpus_per_run, 'GPU')}, or ask a Studio administrator for a larger plan")],
        )


BUSY_SHOWN = 5


def require_plan_capacity(project: Project, run: TrainingRun) -> None:
    """The plan's concurrent runs. Call while holding the project's row lock, so two STARTs cannot both
    take the last slot."""
    plan = project.plan
    active = TrainingRun.objects.filter(project=project).exclude(pk=run.pk).filter(
        Q(status__in=ACTIVE_STATUSES) | Q(status=Status.QUEUED, start_requested_at__isnull=False))
    busy = active.count()
    if busy >= plan.max_concurrent_runs:
        # Which runs hold the slots, so the user knows what to stop (a few, oldest START first): by id
        # in the sentence, and one finding each, which a script reads without parsing the sentence. The
        # name is repr()'d, as the API quotes names: no bidi isolates (U+2068/9, for HTML and terminals)
        # in JSON text, and a control character in a name still shows escaped rather than turning it round.
        holding = list(active.order_by("start_requested_at", "pk")[:BUSY_SHOWN])
        more = f" and {busy - len(holding)} more" if busy > len(holding) else ""
        raise PaymentRequired(
            f"The {plan.name} plan runs {counted(plan.max_concurrent_runs, 'run')} at once and {busy} {'is' if busy == 1 else 'are'} active "
            f"(run{'' if busy == 1 else 's'} {', '.join(str(r.pk) for r in holding)}{more}): "
            "stop one, or ask a Studio administrator for a larger plan (Settings → Billing shows the plan).",
            [Finding(f"runs.{r.pk}", f"run {r.pk} {r.name!r} is {'starting' if r.status == Status.QUEUED else r.status} and takes a slot: "
                                     f"stop it (POST /api/training-runs/{r.pk}/stop, or Stop on its page) to free the slot") for r in holding],
        )


def locked_run(run: TrainingRun) -> TrainingRun:
    """The run's row, locked for this transaction; 404 when it was deleted meanwhile."""
    locked = TrainingRun.objects.select_for_update().filter(pk=run.pk).first()
    if locked is None:
        raise NotFound(f"No training run {run.pk} in your projects: it was deleted.")
    return locked


# ---- create / patch ----------------------------------------------------------------------------

def resolve_experiment(project: Project, key: Any) -> Experiment:
    if key is None or key == "":
        return default_experiment(project)
    experiment = find_experiment(project, key)
    if experiment is None:
        raise BadRequest(f"No experiment {key!r} in project {project.slug}.", [Finding("experiment", "name an existing experiment (id or slug), or create it with POST /api/experiments")])
    return experiment


def run_findings(project: Project, *, name: str, method: str, base_model: str | None = None, dataset: Any = None,
                 config: dict | None = None, compute: dict | None = None, **_: Any) -> list[Finding]:
    """What create_run would refuse (400) in these fields, as findings, creating nothing: a form with a
    field it could not even parse shows the other fields' problems in the same answer."""
    findings = name_findings(name)
    try:
        validate_draft(Draft(method=method, base_model=base_model, dataset=dataset, config=config or {}, compute=compute or {}, project=project))
    except BadRequest as exc:
        findings += exc.errors
    return findings


@transaction.atomic
def create_run(project: Project, user, *, name: str, method: str, experiment: Any = None, base_model: str | None = None,
               dataset: Any = None, config: dict | None = None, compute: dict | None = None) -> TrainingRun:
    require_training_plan(project)
    bad_name = name_findings(name)
    try:
        draft = validate_draft(Draft(method=method, base_model=base_model, dataset=dataset, config=config or {}, compute=compute or {}, project=project))
    except BadRequest as exc:
        exc.errors = bad_name + exc.errors  # one 400 with every finding
        raise
    if bad_name:
        raise BadRequest("The run has invalid fields.", bad_name)
    run = TrainingRun.objects.create(
        project=project, experiment=resolve_experiment(project, experiment), created_by=user, name=name.strip(),
        method=draft.method, base_model=draft.base_model or "", dataset=draft.dataset, config=draft.config, compute=draft.compute,
    )
    create_run_branch(run)
    audit.record(AuditEvent.Action.CREATED, run, user=user, details={"method": run.method})
    return run


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def require_patchable(run: TrainingRun) -> None:
    """409 for a run that is active, starting or completed. The API calls it before parsing the
    body too (409 comes before 400 in the contract's precedence); update_run again under the lock."""
    if run.is_active or run.status == Status.COMPLETED or (run.status == Status.QUEUED and run.start_requested_at):
        if run.status == Status.COMPLETED:
            raise Conflict("A completed run cannot be changed: create a new run (or resume from one of its checkpoints).")
        if run.status == Status.QUEUED:
            raise Conflict("This run's START is being handled, so it cannot be changed now: STOP it (it stays queued), change it, then START it again.")
        raise Conflict(f"A {run.status} run cannot be changed: stop it first, or create a new run.")


# Run fields a PATCH cannot change, and why: the schema refuses them as unknown fields.
FIXED_FIELDS = {
    "method": "a run's method cannot change: create a new run with that method",
    "experiment": "a run stays in its experiment (its Data Hub branch is in the experiment's repo): create a new run in the other experiment",
}


@transaction.atomic
def update_run(run: TrainingRun, patch: dict) -> TrainingRun:
    run = locked_run(run)
    require_patchable(run)
    unknown = sorted(set(patch) - set(PATCHABLE))
    if unknown:
        raise BadRequest("The patch has fields that cannot be changed.", [Finding(k, f"only {', '.join(PATCHABLE)} can be patched") for k in unknown])
    name = patch.get("name", run.name)
    if "name" in patch:
        bad_name = name_findings(name)
        if bad_name:
            raise BadRequest("The patch has invalid fields.", bad_name)
        name = name.strip()
    config, compute = run.config, run.compute
    # null deletes the member (RFC 7386), as it does base_model: config and compute go back to their defaults.
    if "config" in patch:  # merged into the config less its filled-in defaults, which are worked out again from the result
        config = {} if patch["config"] is None else merge_patch(method_or_400(run.method).without_defaults(run.config), patch["config"])
    if "compute" in patch:
        compute = {} if patch["compute"] is None else merge_patch(run.compute, patch["compute"])
    draft = validate_draft(Draft(
        method=run.method,
        base_model=patch["base_model"] if "base_model" in patch else (run.base_model or None),
        dataset=merge_patch(run.dataset, patch["dataset"]) if "dataset" in patch else run.dataset,
        config=config, compute=compute, project=run.project,
    ))
    run.name, run.base_model, run.dataset, run.config, run.compute = name, draft.base_model or "", draft.dataset, draft.config, draft.compute
    run.save(update_fields=["name", "base_model", "dataset", "config", "compute"])
    audit.record(AuditEvent.Action.PATCHED, run, details={"fields": sorted(patch)})
    return run


# ---- start / stop ------------------------------------------------------------------------------

def draft_of(run: TrainingRun) -> Draft:
    return Draft(method=run.method, base_model=run.base_model or None, dataset=run.dataset, config=run.config, compute=run.compute, project=run.project,
                 pinned=earlier_pins(run))


def earlier_pins(run: TrainingRun) -> dict:
    """The commits the run's refs were pinned to before: its last START's, over those of the attempt a
    resumed run continues (whose refs resume_run wrote at those commits). START pins them afresh;
    these say, of a ref whose repo was deleted since, what went with it."""
    checkpoint = run.resume_checkpoint if run.resume_checkpoint_id else None
    resumed = attempt_pinned(checkpoint.run, checkpoint.attempt) if checkpoint is not None else {}
    return {**resumed, **(run.pinned or {})}


def start_blockers(run: TrainingRun, draft: Draft | None = None) -> list[Finding]:
    """What START answers with 422 and the Start button shows: the draft's findings (`draft`: the
    run's, when the caller has one already) and the resume checkpoint's."""
    return start_findings(draft or draft_of(run)) + resume_findings(run)


def resume_findings(run: TrainingRun) -> list[Finding]:
    """A child run resumes from its parent's saved step. On the local backend the engine reads that
    path on this machine, and an engine can report any path: only a folder inside the parent
    attempt's own run folder is resumed from (training.backends.local.checkpoint_dir), looked for
    under the current STUDIO_RUNS_DIR (the Studio's var/ may have moved since it was recorded)."""
    checkpoint = run.resume_checkpoint if run.resume_checkpoint_id else None
    if checkpoint is None:
        return []
    findings = resumed_shape_findings(run, checkpoint)
    if (run.compute or {}).get("backend", "local") == "local" and checkpoint_dir(checkpoint) is None:
        where = relocated(checkpoint.run_id, checkpoint.attempt, checkpoint.path) or checkpoint.path
        findings.append(Finding("resume_checkpoint", f"step {checkpoint.step} of run {checkpoint.run_id} is not a checkpoint folder of that run on this machine "
                                                     f"({where}): resume from another step, or start a new run"))
    return findings


def resumed_shape_findings(run: TrainingRun, checkpoint: Checkpoint) -> list[Finding]:
    """A resumed run continues the saved step's weights and optimizer: it must train the same model
    with the same adapter (a PATCH of either failed the engine on a size mismatch), and go past that
    step (a max_steps at or below it trained nothing and still published a model)."""
    findings: list[Finding] = []
    what = f"step {checkpoint.step} of run #{checkpoint.run_id}"
    parent = TrainingRun.objects.filter(pk=checkpoint.run_id).first()
    if parent is not None:
        # What the step's attempt trained with: the parent may have been edited and started again since.
        # A resumed run names its base model at the commit that attempt pinned (resume_run); one
        # resumed before resume_run did so names the attempt's own ref, which resumed_pins pins.
        trained = pinned_attempt_settings(parent, checkpoint.attempt)
        if (run.base_model or "") not in {trained["base_model"] or "", attempt_record(parent, checkpoint.attempt).base_model or ""}:
            # Once its repo is deleted, setting it back only meets START's finding that it is gone.
            back = ("it was deleted with its repo, so no run can resume from that step: delete this run, and create a new one"
                    if gone_pins({"base_model": attempt_pinned(parent, checkpoint.attempt).get("base_model")}) else "set base_model back to it, or start a new run")
            findings.append(Finding("base_model", f"{what} trained {trained['base_model']}: {back} to train {run.base_model or 'another model'}"))
        mine, theirs = run.config or {}, trained["config"] or {}
        if theirs.get("lora_rank") is None:
            # A full fine-tune's checkpoint holds the model's weights, not an adapter of any rank.
            for key in ("lora_rank", "load_in_4bit"):
                if mine.get(key) not in (None, False):
                    findings.append(Finding(f"config.{key}", f"{what} saved full weights (no LoRA): remove {key}, or start a new run to train an adapter"))
        else:
            for key, unset in (("lora_rank", None), ("load_in_4bit", False)):
                if (mine.get(key) or unset) != (theirs.get(key) or unset):
                    instead = f"start a new run with {key} {mine.get(key)}" if mine.get(key) not in (None, False) else f"start a new run without {key}"
                    findings.append(Finding(f"config.{key}", f"{what} saved an adapter with {key} {theirs.get(key) or unset}: set it back, or {instead}"))
    max_steps = (run.config or {}).get("max_steps")
    if isinstance(max_steps, int) and max_steps <= checkpoint.step:
        findings.append(Finding("config.max_steps", f"{what} is where this run starts, and max_steps is {max_steps}: raise max_steps above {checkpoint.step} to train further"))
    return findings


def start_run(run: TrainingRun) -> TrainingRun:
    from training.tasks import dispatch_run

    with transaction.atomic():
        project = Project.objects.select_for_update(of=("self",)).select_related("plan").get(pk=run.project_id)
        run = locked_run(run)
        run.project = project
        require_training_plan(project)
        if run.status == Status.COMPLETED:
            raise Conflict("This run has completed: create a new run to train again.")
        if run.is_active or (run.status == Status.QUEUED and run.start_requested_at):
            raise Conflict(f"This run is already {'starting' if run.status == Status.QUEUED else run.status}.")
        require_plan_gpus(project, run)
        # The run's own findings (422) before the plan's concurrent runs (402): a user who stops another
        # run to free a slot should not only then hear that this one cannot start as it is.
        findings = start_blockers(run)
        if findings:
            raise Unprocessable(errors=findings)
        require_plan_capacity(project, run)
        if run.status in (Status.FAILED, Status.CANCELLED):
            wipe_attempt_data(run)
            if kept_run_repo(run) is None:  # deleted since the run ended: its checkpoints commit there, and nothing else makes it
                create_run_branch(run)
            status_service.transition(run.pk, Status.QUEUED, note="restarted")
        TrainingRun.objects.filter(pk=run.pk).update(start_requested_at=timezone.now(), pinned=resumed_pins(run, pin_refs(run)))
        audit.record(AuditEvent.Action.STARTED, run, details={"previous_status": run.status})
        sending = send_after_commit(dispatch_run, run.pk)
    run.refresh_from_db()
    if sending.unsent:  # the reconciler dispatches a START no worker claimed (runs_to_redispatch)
        run.queue_notice = QUEUE_DOWN_START
    return run


QUEUE_DOWN_START = ("START is recorded, but the task queue (Redis) cannot be reached: the run starts once it can be "
                    "reached again and a worker picks it up. Nothing more to do here; STOP withdraws it.")
QUEUE_DOWN_STOP = ("The run is cancelled, but the task queue (Redis) cannot be reached: its backend job is stopped "
                   "once it can be reached again (the reconciler sends the stop).")


def resumed_pins(run: TrainingRun, pinned: dict) -> dict:
    """`pinned` (pin_refs) with a resumed run's base model at the commit its checkpoint's attempt
    trained on, where the ref is the same: the saved adapter and optimizer belong to those weights,
    and a branch that moved since would put them on others. resume_run names that commit in the
    run's refs itself (pinned_attempt_settings); this pins a run resumed before it did."""
    checkpoint = run.resume_checkpoint
    if checkpoint is None or "base_model" not in pinned:
        return pinned
    trained = (RunAttempt.objects.filter(run_id=checkpoint.run_id, attempt=checkpoint.attempt).values_list("pinned", flat=True).first() or {}).get("base_model")
    if trained and trained.get("ref") == pinned["base_model"]["ref"]:
        pinned = {**pinned, "base_model": trained}
    return pinned


def wipe_attempt_data(run: TrainingRun) -> None:
    """A restart starts clean series; committed checkpoints stay (seed 001), and so do the earlier
    attempts' logs (each line has its attempt: GET .../logs?attempt=, the run page's log links), a
    failed attempt's traceback with them."""
    MetricPoint.objects.filter(run=run).delete()
    Rollout.objects.filter(run=run).delete()
    IngestBatch.objects.filter(run=run).delete()


def stop_run(run: TrainingRun) -> TrainingRun:
    from training.tasks import stop_backend_job

    with transaction.atomic():
        run = locked_run(run)
        if run.status == Status.QUEUED and run.start_requested_at is not None:
            return withdraw_start(run)
        if not run.is_active:
            raise Conflict(f"Only a provisioning or running run can be stopped; this one is {run.status}.")
        run = status_service.transition(run.pk, Status.CANCELLED, note="stopped by user")
        audit.record(AuditEvent.Action.STOPPED, run, details={"attempt": run.attempt})
        TrainingRun.objects.filter(pk=run.pk).update(start_requested_at=None)
        mark_stopping(run)
        attempt, job_id = run.attempt, run.backend_job_id
        transaction.on_commit(lambda: signal_stop(run, attempt, job_id))
        sending = send_after_commit(stop_backend_job, run.pk, attempt, job_id, on_unsent=lambda: keep_unsent_stop(run.pk, attempt, job_id))
    run.refresh_from_db()
    if sending.unsent:
        run.queue_notice = QUEUE_DOWN_STOP
    return run


def keep_unsent_stop(run_id: int, attempt: int, job_id: str) -> None:
    """Record a stop_backend_job task the broker did not take, for the reconciler to send (resend_stop):
    without it the job would run on at its backend, and its stop mark would hold a DELETE for hours."""
    RunAttempt.objects.filter(run_id=run_id, attempt=attempt).update(unsent_stop_job=job_id)


def resend_stop(attempt_pk: int) -> None:
    """Send a stop_backend_job task that STOP could not send (keep_unsent_stop); kept when it fails again."""
    from training.tasks import stop_backend_job

    row = RunAttempt.objects.filter(pk=attempt_pk, unsent_stop_job__isnull=False).values_list("run_id", "attempt", "unsent_stop_job").first()
    if row is None:
        return
    run_id, attempt, job_id = row
    if send(stop_backend_job, run_id, attempt, job_id):
        RunAttempt.objects.filter(pk=attempt_pk, unsent_stop_job=job_id).update(unsent_stop_job=None)


# A START waits this long for a worker to claim it before the run page and the API ask whether one runs.
UNCLAIMED_NOTICE_AFTER = timedelta(seconds=30)


def unclaimed_notice(run: TrainingRun, now=None) -> str:
    """For a START no worker has claimed for UNCLAIMED_NOTICE_AFTER: ask whether the worker runs (with
    none, nothing else would say so: the reconciler that dispatches again runs on it too). "" otherwise."""
    if run.status != Status.QUEUED or run.start_requested_at is None:
        return ""
    waited = (now or timezone.now()) - run.start_requested_at
    if waited < UNCLAIMED_NOTICE_AFTER:
        return ""
    return (f"No worker has picked this run up for {int(waited.total_seconds())} s: is the Studio's worker running? "
            "(make studio starts it; production: README's worker command)")


def run_notice(run: TrainingRun) -> str:
    """What the run page and RunOut.notice say beside the run's status: START's or STOP's own notice, else
    a START that waits on a worker."""
    return run.queue_notice or unclaimed_notice(run)


def withdraw_start(run: TrainingRun) -> TrainingRun:
    """STOP of a run whose START no worker has claimed yet (the workers are busy or down): the request
    is withdrawn and the run stays queued, as before START. Call with the run's row locked: the
    dispatch claims only a run whose start is still requested, so one of the two wins."""
    TrainingRun.objects.filter(pk=run.pk).update(start_requested_at=None)
    audit.record(AuditEvent.Action.STOPPED, run, details={"attempt": run.attempt, "withdrawn": True})
    add_log(run, "[studio] START withdrawn by user before a worker claimed the run: it stays queued")
    run.refresh_from_db()
    return run


# ---- delete ------------------------------------------------------------------------------------

def delete_run(run: TrainingRun) -> bool:
    """Delete a run that nothing needs any more: its row with its metrics, logs, rollouts and
    checkpoint records, and (once that commits) its folder on this machine. What it committed stays
    in the Data Hub on branch run-<id> of its experiment's repo, which can be deleted once the run
    is gone; a branch it committed nothing to goes with it (remove_empty_run_branch), and then this
    returns True. 409 with each reason while the run is live, its engine is still exiting, a merge
    of one of its steps runs or another run was resumed from it (whose lineage points here)."""
    with transaction.atomic():
        run = locked_run(run)
        findings = delete_blockers(run)
        if findings:
            raise Conflict(f"Run #{run.pk} ({run.name}) cannot be deleted yet.", findings)
        audit.record(AuditEvent.Action.DELETED, run, details={"method": run.method, "status": run.status, "attempts": run.attempt})
        branch_removed = remove_empty_run_branch(run)
        run_id = run.pk
        run.delete()
        transaction.on_commit(lambda: remove_run_folder(run_id))
    return branch_removed


def delete_blockers(run: TrainingRun) -> list[Finding]:
    """Why `run` cannot be deleted now, each with what to do; [] when it can."""
    from training.checkpoints import merging_steps

    findings: list[Finding] = []
    if run.is_active:
        findings.append(Finding("status", f"the run is {run.status}: STOP it first, then delete it"))
    elif run.status == Status.QUEUED and run.start_requested_at:
        findings.append(Finding("status", "its START is waiting for a worker: STOP it (which withdraws the START), then delete it"))
    elif run.backend_name == "local" and job_lingers(run.pk, run.attempt, run.backend_job_id):
        findings.append(Finding("status", "its engine is still exiting after the run ended: try again in a few seconds"))
    elif stopping_on_backend(run):
        findings.append(Finding("status", "the run is still stopping on its backend: try again in a few seconds"))
    for child in TrainingRun.objects.filter(parent=run).select_related("resume_checkpoint").order_by("pk"):
        resumed_from = f"step {child.resume_checkpoint.step}" if child.resume_checkpoint_id else "a checkpoint"
        findings.append(Finding("children", f"run #{child.pk} ({child.name}, {child.status}) was resumed from {resumed_from} of this run: "
                                            f"delete run #{child.pk} first, since its lineage points here"))
    for step in sorted(merging_steps(list(Checkpoint.objects.filter(run=run)))):
        findings.append(Finding("checkpoints", f"step {step} is being merged: wait until it is listed as merged (or its merge fails), then delete"))
    return findings


def remove_run_folder(run_id: int) -> None:
    """Remove a deleted run's folder under STUDIO_RUNS_DIR (its attempts' output, engine logs and
    environment files). A failure is logged: the run is already gone and the folder holds nothing
    another run reads."""
    folder = Path(settings.STUDIO_RUNS_DIR) / str(run_id)
    if not folder.is_dir() or folder.is_symlink():
        return
    try:
        shutil.rmtree(folder)
    except OSError:
        log.exception("the folder of deleted run %s could not be removed: %s", run_id, folder)


# ---- dispatch (Celery) -------------------------------------------------------------------------

def job_spec(run: TrainingRun, token: str) -> JobSpec:
    """The engine's view of one attempt. Data Hub refs become their pinned commits, fetched by the
    engine from Studio's HF-compatible /hub with this attempt's token."""
    inputs = engine_inputs(run, token)
    config = run.config
    teacher = inputs["teacher_model"]
    if teacher:  # the engine loads "repo@commit" through HF_ENDPOINT like any hub id with a revision
        config = {**config, "distillation": {**config["distillation"], "teacher_model": f"{teacher['repo']}@{teacher['commit']}"}}
    return JobSpec(
        run_id=run.pk, attempt=run.attempt, method=run.method, base_model=inputs["base_model"],
        base_model_revision=inputs["base_model_revision"], dataset=inputs["dataset"], eval_dataset=inputs["eval_dataset"], config=config, compute=run.compute,
        ingest_url=f"{settings.STUDIO_PUBLIC_URL}/api/ingest/runs/{run.pk}", ingest_token=token,
        resume_from=resume_path(run.resume_checkpoint, run.backend_name) if run.resume_checkpoint_id else None,
        environment=job_environment(run), env={**inputs["env"], **judge_env(run)},
    )


def dispatch(run_id: int) -> bool:
    """Claim a started run and submit it. Returns False when there was nothing to claim."""
    token = crypto.new_token(INGEST_TOKEN_PREFIX)
    now = timezone.now()
    # submit_started_at is the submit's lease: if this worker dies before the backend has a job id,
    # the reconciler submits the attempt again once the lease runs out (resubmit), exactly once.
    with transaction.atomic():  # the claim and its attempt's record commit together
        claimed = TrainingRun.objects.filter(pk=run_id, status=Status.QUEUED, start_requested_at__isnull=False).update(
            status=Status.PROVISIONING, attempt=F("attempt") + 1, ingest_token_hash=crypto.hash_token(token),
            backend_job_id="", start_requested_at=None, last_heartbeat_at=now, poll_failures=0, next_poll_at=None,
            provisioning_since=now, worker_up_at=None, submit_started_at=now, interruptions=0,
        )
        if not claimed:
            return False
        run = TrainingRun.objects.select_related("project").get(pk=run_id)
        record_attempt(run)
    add_log(run, "[studio] status → provisioning: claimed by a worker")
    add_log(run, f"[studio] attempt {run.attempt} trains from {trained_from(run.base_model, run.dataset, run.config, run.pinned)}")
    add_log(run, f"[studio] attempt {run.attempt}: submitting to the {run.backend_name} backend")
    submit_attempt(run, token)
    return True


def record_attempt(run: TrainingRun) -> RunAttempt:
    """Keep what the run's current attempt trains with. Call in the transaction that claims the
    attempt (dispatch, the reconciler's retry after an interruption): a run cannot be edited while it
    is active, so these stay its settings until the attempt ends."""
    recorded, _ = RunAttempt.objects.get_or_create(run=run, attempt=run.attempt, defaults={
        "base_model": run.base_model, "dataset": run.dataset, "config": run.config, "compute": run.compute, "pinned": run.pinned,
    })
    return recorded


def attempt_record(run: TrainingRun, attempt: int) -> TrainingRun | RunAttempt:
    """What attempt `attempt` of `run` trained with; the run itself for an attempt claimed before the
    Studio recorded attempts (RunAttempt)."""
    return RunAttempt.objects.filter(run=run, attempt=attempt).first() or run


def attempt_settings(run: TrainingRun, attempt: int) -> dict[str, Any]:
    """The base_model, dataset, config and compute that attempt `attempt` of `run` trained with; the
    run's current ones for an attempt claimed before the Studio recorded attempts (RunAttempt)."""
    return settings_of(attempt_record(run, attempt))


def settings_of(source: TrainingRun | RunAttempt) -> dict[str, Any]:
    return {"base_model": source.base_model, "dataset": source.dataset, "config": source.config, "compute": source.compute}


def attempt_pinned(run: TrainingRun, attempt: int) -> dict[str, dict]:
    """The commits START pinned the Data Hub refs of attempt `attempt` of `run` to (pin_refs' shape)."""
    return attempt_record(run, attempt).pinned or {}


def pinned_attempt_settings(run: TrainingRun, attempt: int) -> dict[str, Any]:
    """attempt_settings with each Data Hub ref written at the commit that attempt trained on
    (`student@<commit id>`): what a run resumed from one of its steps trains with. Its saved weights and
    optimizer belong to those commits' model and data, and a branch that moved since, or was deleted
    (allowed once the run has ended), would train it on other ones or not start it at all."""
    source = attempt_record(run, attempt)
    return refs_at_pins(settings_of(source), source.pinned or {})


def job_to_stop(backend, run_id: int, attempt: int, job_id: str) -> str:
    """`job_id`, or when a lost worker never saved it, the job the backend finds for the attempt ("" if none)."""
    return job_id or backend.find_job(run_id, attempt) or ""


def signal_stop(run: TrainingRun, attempt: int, job_id: str) -> None:
    """STOP's own first step at its backend (backends.base.Backend.signal_stop); stop_backend_job follows."""
    backend = get_backend(run.backend_name)
    if backend is not None:
        try:
            job_id = job_to_stop(backend, run.pk, attempt, job_id)
        except Exception as exc:  # noqa: BLE001 - the stop task looks again
            log.warning("looking up run %s's job failed: %s", run.pk, exc)
    if backend is not None and job_id:
        try:
            backend.signal_stop(run.pk, attempt, job_id)
        except Exception as exc:  # noqa: BLE001 - the stop task does the whole stop anyway
            log.warning("signalling run %s's job to stop failed: %s", run.pk, exc)


# The stop task asks a backend that is down again for about six hours (tasks.stop_backend_job); a
# mark older than this is a task that gave up or was lost, and no longer holds a DELETE.
STOP_MARK_EXPIRES = timedelta(hours=7)


def mark_stopping(run: TrainingRun) -> None:
    """Record that the run's current attempt's job is handed to the stop_backend_job task. Call while
    the attempt is the run's current one (it is active, so its record is its settings)."""
    RunAttempt.objects.filter(pk=record_attempt(run).pk).update(stop_requested_at=timezone.now())


def stopping_on_backend(run: TrainingRun) -> bool:
    """Whether a stop_backend_job task of any of the run's attempts has not finished: it reads the
    run's row (its backend and connection), so a run deleted before it runs would leave its job running."""
    return RunAttempt.objects.filter(run=run, stop_requested_at__gt=timezone.now() - STOP_MARK_EXPIRES).exists()


def stop_backend_job(run_id: int, attempt: int, job_id: str) -> None:
    """Stop attempt `attempt`'s job at its backend, then clear that attempt's stop mark, also when the
    stop fails for good; a backend that is down raises BackendUnavailable (the task asks again) and
    the mark stays. Another attempt's mark is that attempt's stop to clear."""
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None:
        return
    asked_again = False
    try:
        stop_attempt_job(run, attempt, job_id)
    except BackendUnavailable:
        asked_again = True
        raise
    finally:
        if not asked_again:
            RunAttempt.objects.filter(run_id=run_id, attempt=attempt).update(stop_requested_at=None)


def stop_attempt_job(run: TrainingRun, attempt: int, job_id: str) -> None:
    run_id = run.pk
    backend = get_backend(run.backend_name)
    if backend is not None:
        job_id = job_to_stop(backend, run_id, attempt, job_id)
    if backend is not None and job_id:
        backend.stop(run_id, attempt, job_id)
        add_log(run, f"[studio] attempt {attempt}: job {job_id} stopped")


def add_log(run: TrainingRun, line: str) -> None:
    LogLine.objects.create(run=run, attempt=run.attempt, line=line)


def fail(run: TrainingRun, code: str, message: str, log_tail: list[str] | None = None) -> None:
    try:
        status_service.transition(run.pk, Status.FAILED, attempt=run.attempt, error={"code": str(code), "message": message, "log_tail": (log_tail or [])[-200:]}, note=message)
    except status_service.IllegalTransition:
        pass  # it ended some other way meanwhile (stopped, completed)


# ---- submitting an attempt (dispatch, and the reconciler's retries and resubmits) --------------

def backoff_seconds(failures: int) -> int:
    """Seconds until a backend that failed `failures` times in a row is asked again: a failed submit
    here and a failed poll in the reconciler share the one schedule (run.poll_failures)."""
    return min(600, 15 * 2 ** max(0, failures - 1))


def last_checkpoint_path(run: TrainingRun) -> str | None:
    """Where an attempt after a spot interruption resumes from: the newest step this START's attempts
    saved. An attempt before a "Start again" trained other weights, maybe further: never those. Only
    a saved step (kind checkpoint: a final, adapter or merged folder has no optimizer state to resume),
    and on the local backend only a folder inside its attempt's own run folder, as START's
    resume_findings checks for a resumed run: an engine can report any path."""
    saved = Checkpoint.objects.filter(run=run, attempt__gte=run.start_attempt, kind="checkpoint").order_by("-step", "-id")
    for checkpoint in saved:
        if run.backend_name != "local" or checkpoint_dir(checkpoint) is not None:
            return resume_path(checkpoint, run.backend_name)
    return None


def resume_path(checkpoint: Checkpoint, backend: str) -> str:
    """The resume_from an engine on `backend` gets for `checkpoint`. A remote machine's folder as its
    engine reported it; on the local backend the folder where it lies now (checkpoint_dir), which is
    not where it was recorded once the Studio's var/ was moved or copied. A local one that is no
    folder of its run's any more (START checked it was; it went since) becomes where it would be
    (relocated; for a path of no attempt's output, which START refuses, the step's usual folder
    there), so the engine fails naming that folder and never reads one outside its run's own."""
    if backend != "local":
        return checkpoint.path
    folder = checkpoint_dir(checkpoint) or relocated(checkpoint.run_id, checkpoint.attempt, checkpoint.path)
    return str(folder or output_dir(checkpoint.run_id, checkpoint.attempt) / f"checkpoint-{checkpoint.step}")


def submit_attempt(run: TrainingRun, token: str) -> None:
    """Hand this attempt to its backend. A transient backend error leaves the run provisioning with no
    job id (resubmitted later); any other failure ends it provisioning_error."""
    backend = get_backend(run.backend_name)
    spec = job_spec(run, token)
    if run.interruptions:
        spec.resume_from = last_checkpoint_path(run)
    try:
        if backend is None:
            raise BackendError(f"unknown backend {run.backend_name!r}")
        job_id = backend.submit(spec)
    except BackendUnavailable as exc:
        failures = run.poll_failures + 1
        TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, backend_job_id="").update(
            submit_started_at=None, poll_failures=failures, next_poll_at=timezone.now() + timedelta(seconds=backoff_seconds(failures)))
        add_log(run, f"[studio] the {run.backend_name} backend is unreachable ({exc}); the submit is tried again")
        return
    except Exception as exc:  # noqa: BLE001 - any other failure to submit fails the attempt, with its reason
        log.exception("submitting run %s failed", run.pk)
        fail(run, ErrorCode.PROVISIONING_ERROR, f"the {run.backend_name} backend could not start the job: {exc}")
        return
    still_ours = TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status__in=ACTIVE_STATUSES).update(backend_job_id=job_id, poll_failures=0)
    if not still_ours:
        # STOP landed while we were submitting: abort what we just started.
        backend.stop(run.pk, run.attempt, job_id)
    else:
        add_log(run, f"[studio] submitted: job {job_id}")
        for warning in backend.submit_warnings():
            add_log(run, f"[studio] warning: {warning}")
