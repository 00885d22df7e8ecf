"""The seams the rest of Studio calls for experiments and runs (the Data Hub's own rows are
written by datahub.repos and datahub.commits):

- provision_experiment_repo: an experiment's repo `experiment-<slug>` is created on first use.
- create_run_branch: each run is a branch `run-<id>` in its experiment's repo, made at create time;
  delete_branch refuses it while the run exists, and remove_empty_run_branch drops it with its run
  when nothing was committed to it.
- record_checkpoint: a reported checkpoint's directory is committed to `run-<id>` by a Celery task,
  with the run's metrics, rollouts and settings as of its step (datahub.run_record).
- publish_model: a run's final or merged weights become a model repo with a card and its settings
  (the Models page).
- storage_full: a full blob storage fails the run with what to do.
- delete_repo / delete_branch / delete_tag: a repo, branch or tag goes only while no live run
  uses it (repo_uses / ref_uses say how a run does).
- delete_files: files or folders leave a branch as a new commit, except a run's branch.
- create_repo: a person's new repo (the Studio's own repos are repos.get_or_create_repo's).
Each of a person's changes here (and the upload sessions' commits, datahub.uploads) is recorded in
the audit trail (studio.audit) once.
- refuse_run_branch: the one rule for a person's writes to a run's branch (deleting it or its
  files, uploading to it); create_branch / create_tag keep run-<id> names for the runs.

A run's `[project/]repo@ref` refs (pre-start checks, pinning, engine inputs) are datahub.refs.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from datahub import refs, repos, run_record, storage
from datahub.commits import FileSource, commit_blobs, commit_files, commit_files_on, store_blobs
from datahub.models import Branch, Commit, Repo, RepoType, Tag, TreeEntry
from datahub.repos import MAIN, get_or_create_repo
from experiments.models import Experiment
from studio import audit, webhooks
from studio.errors import ApiError, BadRequest, Conflict, Finding, counted
from studio.models import AuditEvent, WebhookEvent

log = logging.getLogger(__name__)


# ---- experiments and runs ----------------------------------------------------------------------

def experiment_repo_name(experiment) -> str:
    return f"{repos.EXPERIMENT_PREFIX}{experiment.slug}"[:128]


def provision_experiment_repo(experiment) -> Repo:
    """Make sure `experiment` has its Data Hub repo `experiment-<slug>` and record its id."""
    repo = get_or_create_repo(experiment.project, experiment_repo_name(experiment), RepoType.EXPERIMENT)
    if repo.type != RepoType.EXPERIMENT:  # one made before such names were kept for experiments
        raise Conflict(f"{repo.full_name} is a {repo.type} repo, not experiment {experiment.name}'s.",
                       [Finding("experiment", f"rename or delete the {repo.type} repo {repo.name} in the Data Hub, then commit again")])
    if experiment.hub_repo != repo.full_name:
        experiment.hub_repo = repo.full_name
        experiment.save(update_fields=["hub_repo"])
    return repo


def run_branch_name(run) -> str:
    return f"run-{run.pk}"


def run_repo(run) -> Repo:
    return provision_experiment_repo(run.experiment)


def create_run_branch(run) -> Branch:
    """Create branch `run-<id>` from main in the run's experiment repo (kept across restarts)."""
    return repos.create_branch(run_repo(run), run_branch_name(run), MAIN)


def kept_run_repo(run) -> Repo | None:
    """The run's experiment repo while it still holds branch run-<id>; None once the repo was deleted
    (one made again by a later run of the experiment does not have the branch). A checkpoint commit
    or a merge then writes nothing: making the repo or the branch again would hold that one
    checkpoint, with the run's history and its other checkpoints' commits gone."""
    repo = repos.find_repo(run.project, experiment_repo_name(run.experiment))
    if repo is None or not Branch.objects.filter(repo=repo, name=run_branch_name(run)).exists():
        return None
    return repo


def run_branch_gone(run) -> str:
    return f"branch {run_branch_name(run)} of {run.project.slug}/{experiment_repo_name(run.experiment)} was deleted with its repo"



def remove_empty_run_branch(run) -> bool:
    """Delete branch run-<id> of `run`, which delete_run is deleting (call in its transaction),
    when the branch holds nothing of the run's own: its head is still in the history of the repo's
    default branch, where create_run_branch made it, so no checkpoint or upload was ever committed
    to it. A branch with commits of its own stays (the run's artifacts are the user's to keep or
    delete), as does one a live run names in a `repo@branch` ref. True when the branch went."""
    from training.models import ACTIVE_STATUSES, Status, TrainingRun

    repo = repos.find_repo(run.project, experiment_repo_name(run.experiment))
    if repo is None:
        return False
    name = run_branch_name(run)
    repos.lock_refs(repo)
    # The branch row alone (see commit_blobs), whose lock waits for a commit moving the branch: the
    # check below then reads that commit as the head, and keeps the branch.
    branch = Branch.objects.select_for_update().filter(repo=repo, name=name).first()
    main = Branch.objects.filter(repo=repo, name=repo.default_branch).first()
    if branch is None or main is None or not repos.is_ancestor(repo, branch.head, main.head_id):
        return False
    live = TrainingRun.objects.filter(project_id=repo.project_id, status__in=(Status.QUEUED, *ACTIVE_STATUSES)).exclude(pk=run.pk)
    if any(ref_uses(other, repo, name) for other in live):
        return False
    branch.delete()
    return True

RUN_BRANCH_RE = re.compile(r"^run-(\d+)$")


def branch_run(repo: Repo, name: str):
    """The training run whose branch `name` is in `repo` (its experiment's repo), or None."""
    return branch_runs(repo, [name]).get(name)


def branch_runs(repo: Repo, names: Iterable[str]) -> dict[str, Any]:
    """branch_run for many branch names in one query: {name: run} for those that are a run's."""
    from training.models import TrainingRun

    ids = {name: int(match[1]) for name in names if (match := RUN_BRANCH_RE.match(name)) and int(match[1]) < 2**63}
    runs = TrainingRun.objects.select_related("experiment").filter(pk__in=set(ids.values()), project_id=repo.project_id).in_bulk() if ids else {}
    return {name: runs[pk] for name, pk in ids.items() if pk in runs and experiment_repo_name(runs[pk].experiment) == repo.name}


def refuse_run_branch(repo: Repo, name: str, what: str, keep: str) -> None:
    """A 409 when branch `name` is a training run's and the run exists: its checkpoints are
    committed there, and the run page's Checkpoints and Repository tabs read it. `what` is what
    cannot happen ("it cannot be deleted"), `keep` the first thing to do instead ("keep the branch").
    The one rule for a person's writes to a run's branch: delete_branch, delete_files and the
    upload sessions (datahub.uploads) call it. The Studio's own commits there (commit_checkpoint)
    do not: they are the only writes the branch takes while its run exists."""
    run = branch_run(repo, name)
    if run is not None:
        raise Conflict(f"Branch {name!r} holds the checkpoints of run #{run.pk} ({run.name}): {what} while the run exists.",
                       [Finding("branch", f"{keep}, or delete run #{run.pk} first")])


def create_repo(project, name: str, type: str = RepoType.MODEL, user=None, description: str = "") -> Repo:
    """A person's new repo (repos.create_repo): the API's POST and the Data Hub's New repo."""
    with transaction.atomic():
        repo = repos.create_repo(project, name, type, user, description)
        audit.record(AuditEvent.Action.CREATED, repo, user=user, details={"type": repo.type})
    return repo


def _ref_event(action: str, ref: Branch | Tag, repo: Repo, **details: Any) -> None:
    audit.record(action, ref, project=repo.project, details={"repo": repo.full_name, **details})


def create_branch(repo: Repo, name: str, from_ref: str, *, name_field: str = "branch", from_field: str = "ref") -> Branch:
    """A person's new branch (repos.create_branch), except a run-<id> name in an experiment's repo."""
    _refuse_run_ref_name(repo, name, name_field, "branch")
    # After repos.create_branch's own transaction, not in one around it: its 409 for a branch made
    # concurrently must not roll back what that other request made.
    branch = repos.create_branch(repo, name, from_ref, name_field=name_field, from_field=from_field, exist_ok=False)
    _ref_event(AuditEvent.Action.CREATED, branch, repo, head=branch.head_id)
    return branch


def create_tag(repo: Repo, name: str, ref: str, *, name_field: str = "tag") -> Tag:
    """A person's new tag (repos.create_tag), except a run-<id> name in an experiment's repo."""
    _refuse_run_ref_name(repo, name, name_field, "tag")
    tag = repos.create_tag(repo, name, ref, name_field=name_field)  # as create_branch, outside its transaction
    _ref_event(AuditEvent.Action.CREATED, tag, repo, commit=tag.commit_id)
    return tag


def _refuse_run_ref_name(repo: Repo, name: str, field: str, what: str) -> None:
    """A 400 for a branch or tag named run-<id> in an experiment's repo: create_run_branch makes
    run-<id> for run <id> when the run is created, and would take a branch made before it as the
    run's own (with whatever was committed to it), or fail on a tag of that name."""
    repos.check_ref_name(name, field, f"{what} name")  # first: what is not a name at all says so
    if repo.type == RepoType.EXPERIMENT and RUN_BRANCH_RE.match(name):
        raise BadRequest(f"{name!r} is kept for a training run's branch in {repo.full_name}.",
                         [Finding(field, f"{what} names run-<id> in an experiment's repo are made by Studio for each run's checkpoints: "
                                         f"choose another name, e.g. my-{name}")])


def delete_branch(repo: Repo, name: str) -> None:
    """Delete a branch, except the default branch, a training run's branch while the run exists
    (its checkpoints are committed there, and the run page links to it) and a branch a live run
    names in a `repo@branch` ref (ref_uses): each a 409. The API's DELETE and the repo page's
    Delete branch both call this."""
    refuse_run_branch(repo, name, "it cannot be deleted", "keep the branch")
    with transaction.atomic():
        repos.lock_refs(repo)  # as delete_repo: the check and the delete under the repo's row lock
        # a branch that is not there (404) or the default branch (409) is repos.delete_branch's to say
        branch = Branch.objects.filter(repo=repo, name=name).exclude(name=repo.default_branch).first()
        if branch is not None:
            _refuse_while_live_runs_use(repo, lambda run: ref_uses(run, repo, name), f"Branch {name!r} of {repo.full_name}", "the branch", "branch")
        repos.delete_branch(repo, name)
        if branch is not None:  # else repos.delete_branch refused
            _ref_event(AuditEvent.Action.DELETED, branch, repo, head=branch.head_id)


def delete_files(repo: Repo, branch: str, paths: list[str], author=None, message: str = "", parent: str | None = None) -> Commit:
    """Delete `paths` from `branch` as a new commit (commits.commit_blobs): each is a file, or a
    folder with every file under it (a trailing "/" is allowed), that the branch's head has, else a
    404 naming paths[i]; with `parent`, the branch must still be at that commit (a 409). The commit
    message, unless given, names what was deleted. The API's DELETE .../files and the repo page's
    Delete of a file both call this.

    A run's branch is refused while the run exists, as delete_branch refuses it. A branch that a
    live run names in a `repo@branch` ref is not: START pins every ref to a commit, and commits keep
    their files, so a started run reads what it started with; a queued run reads the branch as it
    is when it starts, and deleting the file START refused is how such a run is fixed."""
    refuse_run_branch(repo, branch, "its files cannot be deleted", "keep them")
    cleaned = [repos.clean_path(path.removesuffix("/"), f"paths[{i}]") for i, path in enumerate(paths)]
    with transaction.atomic():
        commit = commit_blobs(repo, branch, {}, message, author, delete=cleaned, parent=parent, delete_field="paths")
        audit.record(AuditEvent.Action.FILES_DELETED, repo, user=author, details=commit_details(branch, commit, cleaned))
    return commit


AUDITED_PATHS = 20


def commit_details(branch: str, commit: Commit, paths: list[str]) -> dict[str, Any]:
    """An audit event's details for a commit of `paths`: the first AUDITED_PATHS of them (an upload
    may hold thousands; the commit lists them all)."""
    return {"branch": branch, "commit": commit.pk, "paths": paths[:AUDITED_PATHS], "path_count": len(paths)}


def delete_tag(repo: Repo, name: str) -> None:
    """Delete a tag (repos.delete_tag), except one a live run names in a `repo@tag` ref: a 409, as
    delete_branch."""
    with transaction.atomic():
        repos.lock_refs(repo)
        tag = Tag.objects.filter(repo=repo, name=name).first()
        if tag is not None:  # else repos.delete_tag's 404
            _refuse_while_live_runs_use(repo, lambda run: ref_uses(run, repo, name), f"Tag {name!r} of {repo.full_name}", "the tag", "tag")
        repos.delete_tag(repo, name)
        if tag is not None:
            _ref_event(AuditEvent.Action.DELETED, tag, repo, commit=tag.commit_id)


def delete_repo(repo: Repo) -> None:
    """Delete a repo with its branches, tags and commits (repos.delete_repo: blob bytes stay),
    unless a live run (queued, provisioning or running) uses it: a 409 naming each such run, what
    it uses the repo for and what to do. A run uses a repo through a `[project/]repo@ref` in its
    base_model, dataset, teacher, environment or RULER dataset (or a commit pinned from one at
    START), as its experiment's repo (its checkpoints go to branch run-<id>) or as the model repo
    its final weights are published to. Finished runs do not hold a repo: their pages keep the refs
    and pinned commit ids as text, and show the repo as gone. An experiment whose repo it was no
    longer names it (Experiment.hub_repo is cleared); its next run creates the repo again.
    The check and the delete run under the repo's row lock; a run that names the repo after it is
    gone is refused by its own pre-start check. A run's checkpoint still to be committed (or merged)
    to its experiment repo, or still to be published to its model repo, is a 409 too, finished run or not."""
    with transaction.atomic():
        repos.lock_refs(repo)
        _refuse_while_live_runs_use(repo, lambda run: repo_uses(run, repo), repo.full_name, "the repo", "name", trained_from_note(repo))
        _refuse_while_runs_commit_to(repo)
        _refuse_while_runs_publish_to(repo)
        audit.record(AuditEvent.Action.DELETED, repo, details={"type": repo.type})  # while it has its pk
        repos.delete_repo(repo)
        # hub_repo names the repo that exists (provision_experiment_repo sets it again on the
        # experiment's next run), so the Experiments list and API never link to a deleted repo.
        Experiment.objects.filter(project_id=repo.project_id, hub_repo=repo.full_name).update(hub_repo="")


def _refuse_while_live_runs_use(repo: Repo, uses_of: Callable[[Any], list[str]], what: str, it: str, field: str, also: str = "") -> None:
    """A 409 naming each live run (queued, provisioning, running) of the repo's project that
    `uses_of` says uses the thing being deleted (`what`: "acme/data", "Branch 'dev' of acme/data"),
    what for, and what to do before deleting `it` ("the repo"); `field` is the finding's field, and
    `also` what else the delete would do, to weigh before trying again."""
    from training.models import ACTIVE_STATUSES, Status, TrainingRun

    live = TrainingRun.objects.filter(project_id=repo.project_id, status__in=(Status.QUEUED, *ACTIVE_STATUSES)).select_related("experiment")
    findings = [Finding(field, f"run #{run.pk} ({run.name}, {run.status}) uses it as {', '.join(uses)}: {_free_repo_hint(run, uses, it)}")
                for run in live.order_by("pk") if (uses := uses_of(run))]
    if findings:
        raise Conflict(f"{what} is used by {counted(len(findings), 'live run')}: it cannot be deleted until they no longer need it.{' ' + also if also else ''}", findings)


# A checkpoint's commit task runs within seconds of its report, and retries for about five minutes;
# one not committed after this never will be (a full disk, a step a later attempt saved again).
COMMIT_PENDING = timedelta(minutes=15)


def _refuse_while_runs_commit_to(repo: Repo) -> None:
    """A 409 naming each run, finished or not, whose checkpoint commit or merge is still to write to
    its branch in `repo` (its experiment repo): deleting the repo under it would lose that commit, or
    leave a checkpoint without one. Call under the repo's row lock."""
    from training.backends.local import checkpoint_dir
    from training.checkpoints import merge_mark_expired
    from training.models import Checkpoint

    if not repo.name.startswith(repos.EXPERIMENT_PREFIX):
        return
    writing = (Checkpoint.objects.filter(run__project_id=repo.project_id)
               .filter(Q(merge_requested_at__gt=merge_mark_expired()) | Q(commit="", created_at__gt=timezone.now() - COMMIT_PENDING))
               .select_related("run", "run__experiment").order_by("run_id", "step", "id"))
    findings = []
    for checkpoint in writing:
        run = checkpoint.run
        if experiment_repo_name(run.experiment) != repo.name:
            continue
        who = f"run #{run.pk} ({run.name})"
        if checkpoint.merge_requested_at and checkpoint.merge_requested_at > merge_mark_expired():
            findings.append(Finding("name", f"{who} is merging step {checkpoint.step} into its base, to commit on branch {run_branch_name(run)}: "
                                            "wait until the step is listed as merged (or its merge fails), then delete the repo"))
        elif not checkpoint.commit and checkpoint_dir(checkpoint) is not None:
            findings.append(Finding("name", f"{who} has its {checkpoint.kind} of step {checkpoint.step} (attempt {checkpoint.attempt}) still to commit "
                                            f"on branch {run_branch_name(run)}: wait until its Checkpoints tab offers its download "
                                            "(a minute or so), then delete the repo"))
    if findings:
        raise Conflict(f"{repo.full_name} is still being written by a run's checkpoint commit or merge: it cannot be deleted yet.", findings)


def _refuse_while_runs_publish_to(repo: Repo) -> None:
    """A 409 naming the run, finished or not, whose final or merged weights are still to be committed
    and then published to `repo` (its model repo): the publish would find the repo gone and publish
    nothing. Call under the repo's row lock."""
    from training.backends.local import checkpoint_dir
    from training.models import Checkpoint

    match = MODEL_REPO_RE.search(repo.name)
    if repo.type != RepoType.MODEL or match is None:
        return
    pending = (Checkpoint.objects.filter(run_id=int(match[1]), run__project_id=repo.project_id, kind__in=MODEL_KINDS, commit="",
                                         created_at__gt=timezone.now() - COMMIT_PENDING)
               .select_related("run", "run__experiment").order_by("step", "id"))
    findings = [Finding("name", f"run #{checkpoint.run_id} ({checkpoint.run.name}) has its {checkpoint.kind} of step {checkpoint.step} "
                                f"(attempt {checkpoint.attempt}) still to publish here: wait until its Checkpoints tab offers its download "
                                "(a minute or so), then delete the repo")
                for checkpoint in pending
                if model_repo_name(checkpoint.run) == repo.name and not is_earlier_merge(checkpoint) and checkpoint_dir(checkpoint) is not None]
    if findings:
        raise Conflict(f"{repo.full_name} is still to receive a run's published model: it cannot be deleted yet.", findings)


def ref_uses(run, repo: Repo, ref: str) -> list[str]:
    """The fields of `run` whose Data Hub ref names branch or tag `ref` of `repo` (`repo@ref`, also
    with its project): [] when none does. A commit pinned at START is not a use: commits outlive
    the branches and tags that named them."""
    from training.refs import HUB_REF

    return [field.removesuffix(".ref") for field, value in refs.run_refs(run.base_model, run.dataset, run.config)
            if (match := HUB_REF.match(value)) and match["repo"] == repo.name and match["project"] in (None, repo.project.slug)
            and match["ref"] == ref]


def repo_uses(run, repo: Repo) -> list[str]:
    """What `run` uses `repo` for: the fields whose Data Hub ref (or pinned commit) names it,
    "its experiment repo" and "its output model repo"; [] when it does not use it."""
    uses = ref_fields_in(run, repo)
    if experiment_repo_name(run.experiment) == repo.name:
        uses.append(f"its experiment repo (branch run-{run.pk})")
    if model_repo_name(run) == repo.name:
        uses.append("its output model repo")
    return uses


def ref_fields_in(run, repo: Repo) -> list[str]:
    """The fields of `run` whose Data Hub ref, or the commit its last START pinned, names `repo`."""
    from training.refs import HUB_REF

    fields: list[str] = []
    for field, value in refs.run_refs(run.base_model, run.dataset, run.config):
        match = HUB_REF.match(value)
        if match and match["repo"] == repo.name and match["project"] in (None, repo.project.slug):
            fields.append(field.removesuffix(".ref"))
    return fields + [field for field, pin in (run.pinned or {}).items() if isinstance(pin, dict) and pin.get("repo") == repo.full_name and field not in fields]


TRAINED_FROM_SHOWN = 5


def ended_runs_trained_from(repo: Repo) -> tuple[list[Any], int]:
    """The ended runs (completed, failed, cancelled) that trained from `repo`, as base model, dataset,
    teacher, environment or RULER dataset (ref_fields_in): a few, oldest first, and how many. They do
    not hold the repo (delete_repo), but its commits they were pinned to go with it, so their Start
    again and Resume from here stop working: the repo's Delete says so before it is done. The text
    search only narrows the rows that ref_fields_in reads."""
    from training.models import Status, TrainingRun

    named = Q(base_model__icontains=repo.name) | Q(dataset__icontains=repo.name) | Q(config__icontains=repo.name) | Q(pinned__icontains=repo.full_name)
    ended = (TrainingRun.objects.filter(named, project_id=repo.project_id, status__in=(Status.COMPLETED, Status.FAILED, Status.CANCELLED))
             .select_related("project").order_by("pk"))
    runs = [run for run in ended if ref_fields_in(run, repo)]
    return runs[:TRAINED_FROM_SHOWN], len(runs)


def trained_from_note(repo: Repo) -> str:
    """What deleting `repo` does to the ended runs that trained from it; "" when none did."""
    shown, count = ended_runs_trained_from(repo)
    if not count:
        return ""
    runs = ", ".join(f"#{run.pk} ({run.name}, {run.status})" for run in shown)
    more = f" and {count - len(shown)} more" if count > len(shown) else ""
    return (f"{counted(count, 'ended run')} trained from it (run {runs}{more}): deleting it deletes the commits they were pinned to, "
            "so their Start again and Resume from here stop working, for good.")


def _free_repo_hint(run, uses: list[str], it: str = "the repo") -> str:
    """What to do so that `run` no longer holds `it` ("the repo", "the branch", "the tag")."""
    from training.models import Status
    from training.services import start_blockers

    if run.status == Status.QUEUED and run.start_requested_at is None:
        # "Start it" only where START would take it: a run it refuses (422) would send the user in circles.
        startable = not start_blockers(run)
        if any(use.startswith("its experiment repo") for use in uses):
            # Edit changes the run's refs and name, never its experiment: that repo stays its own.
            start = "(or start it and let it finish)" if startable else "(it cannot start as it is: its page says why)"
            return f"delete run #{run.pk} if it is not needed {start}, then delete {it}"
        other = "another repo" if it == "the repo" else "another branch, tag or commit id"
        start = f", delete run #{run.pk}, or start it and let it finish" if startable else f" or delete run #{run.pk} (it cannot start as it is: its page says why)"
        return f"edit the run to use {other}{start}, then delete {it}"
    return f"stop the run (STOP on its page) or wait for it to finish, then delete {it}"


CHECKPOINT_DIRS = {"final": "final", "merged": "merged", "adapter": "adapter"}


def checkpoint_prefix(checkpoint, earlier_merge: bool) -> str:
    """Where a checkpoint's files go on the run's branch. A merge of an earlier step (a person's
    Merge on the Checkpoints tab; `earlier_merge`, from is_earlier_merge) lands beside that step,
    not in merged/: that folder, like the Models page entry, is the run's own result at its last step."""
    if earlier_merge:
        return f"checkpoints/step-{checkpoint.step}/merged"
    return CHECKPOINT_DIRS.get(checkpoint.kind) or f"checkpoints/step-{checkpoint.step}"


def branch_folder(checkpoint, last_step: int | None = None) -> str:
    """The folder of the run's branch that holds a checkpoint's files (checkpoint_prefix by is_earlier_merge)."""
    return checkpoint_prefix(checkpoint, is_earlier_merge(checkpoint, last_step))


def is_earlier_merge(checkpoint, last_step: int | None = None) -> bool:
    """A merged checkpoint a person asked for (Merge), or, for one recorded before merges said so, of
    a step before the run's highest checkpoint step (`last_step` when the caller already knows it).
    By the step alone, a Merge of the newest step of a run still training read as the run's result."""
    if checkpoint.kind != "merged":
        return False
    if checkpoint.requested:
        return True
    if last_step is None:
        from django.db.models import Max

        last_step = type(checkpoint).objects.filter(run_id=checkpoint.run_id).aggregate(last=Max("step"))["last"] or 0
    return checkpoint.step < last_step


def record_checkpoint(run, checkpoint) -> None:
    """Hand the checkpoint to a Celery task once the ingest transaction commits: hashing and
    storing a checkpoint directory is slow I/O that must not hold the engine's request."""
    from datahub.tasks import commit_checkpoint

    checkpoint_id = checkpoint.pk
    transaction.on_commit(lambda: _enqueue(commit_checkpoint, checkpoint_id))


def _enqueue(task, *args: Any) -> None:
    try:
        task.delay(*args)
    except Exception:  # noqa: BLE001 - a broker outage must not fail the engine's report
        log.exception("could not enqueue %s%r", task.name, args)


def commit_checkpoint(checkpoint_id: int) -> Commit | None:
    """Commit a checkpoint directory's files under checkpoints/step-<n>/ (or final/, merged/,
    adapter/) on the run's branch; a Merge of a step that a later attempt saved again goes on that
    step's own commit instead (merged_step_commit).

    A run's commits land on its branch one after another, in the order its engine reported the
    checkpoints (issue 5: as they arrive, in step order), though their tasks run side by side on the
    worker and a big step takes longer to store than a small one: each task holds the run's commit
    lock (run_commit_lock) and first commits the run's checkpoints reported before its own that are
    still to commit (uncommitted_before). So step 2's commit is step 4's parent and holds no step-4
    files. One committed after a later one all the same (its commit failed in that task, and its own
    task's retry came after) goes on the commit before that later one, off the branch (commit_before):
    a step's commit never holds later weights, and the branch's history stays in step order.
    Safe to run twice: a checkpoint keeps the commit it recorded."""
    from training.models import Checkpoint

    checkpoint = Checkpoint.objects.select_related("run", "run__experiment", "run__project").filter(pk=checkpoint_id).first()
    if checkpoint is None or checkpoint_folder(checkpoint) is None:
        return None
    with run_commit_lock(checkpoint):
        if kept_run_repo(checkpoint.run) is not None:  # else each earlier one would log again that it is not committed
            for earlier in uncommitted_before(checkpoint):
                try:
                    _commit_checkpoint(earlier)
                except Exception:  # noqa: BLE001 - its own task tries it again; this one must not be held back for it
                    log.exception("run %s: checkpoint %s (step %s), reported before checkpoint %s, could not be committed first",
                                  checkpoint.run_id, earlier.pk, earlier.step, checkpoint.pk)
        checkpoint.refresh_from_db(fields=["commit"])  # a later checkpoint's task may have committed it while this one waited
        return _commit_checkpoint(checkpoint)


# How long a commit task waits for the run's commit lock: a task before it may be storing several
# checkpoints of a big model. One that waited this long is tried again later (an OSError).
COMMIT_LOCK_WAIT_SECONDS = 15 * 60


@contextmanager
def run_commit_lock(checkpoint) -> Iterator[None]:
    """Hold the commit lock of `checkpoint`'s run: its checkpoint commits run one at a time, across
    the worker's processes and threads. It is held while a commit stores its files (minutes for a big
    model), which a row lock could only do by keeping a database transaction open that long; so it is
    a lock file in the run's folder on this machine, where every checkpoint that is committed lies
    (checkpoint_dir), and the kernel frees it when its holder dies. Call only for such a checkpoint."""
    from training.backends.local import run_dir

    path = run_dir(checkpoint.run_id, checkpoint.attempt).parent / "hub-commit.lock"
    deadline = time.monotonic() + COMMIT_LOCK_WAIT_SECONDS
    with open(path, "a") as lock:  # closing it releases the lock
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BlockingIOError(errno.EWOULDBLOCK, f"run {checkpoint.run_id}: its checkpoint commit lock was held for "
                                                             f"{COMMIT_LOCK_WAIT_SECONDS} s by another commit task") from None
                time.sleep(0.2)
        yield


def uncommitted_before(checkpoint) -> list:
    """The checkpoints of `checkpoint`'s run reported before it whose commit is still to come (their
    task is queued, running or retrying: COMMIT_PENDING), oldest first; only those in their attempt's
    folder on this machine are ever committed. An older one without a commit never will have one
    (or was committed before commits were recorded): committing it now would put its files back."""
    from training.backends.local import checkpoint_dir

    pending = (type(checkpoint).objects.select_related("run", "run__experiment", "run__project")
               .filter(run_id=checkpoint.run_id, pk__lt=checkpoint.pk, commit="", created_at__gt=timezone.now() - COMMIT_PENDING).order_by("pk"))
    return [earlier for earlier in pending if checkpoint_dir(earlier) is not None]


def _commit_checkpoint(checkpoint) -> Commit | None:
    """commit_checkpoint's commit of one checkpoint. Call holding the run's commit lock."""
    from training.models import Checkpoint

    run = checkpoint.run
    root = checkpoint_folder(checkpoint)
    if root is None:  # gone since the task began: the run was deleted
        return None
    earlier_merge = is_earlier_merge(checkpoint)
    prefix = checkpoint_prefix(checkpoint, earlier_merge)
    label = checkpoint_label(checkpoint, prefix)
    if checkpoint.commit:  # this task ran before (a retry, acks_late), or a later checkpoint's task committed it first
        commit = Commit.objects.filter(repo__project_id=run.project_id, pk=checkpoint.commit).first()
        if commit is not None and checkpoint.kind in MODEL_KINDS and not earlier_merge:
            _publish(run, checkpoint)  # an earlier try may have stopped between its commit and the publish
        return commit
    files: dict[str, FileSource] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue  # a symlink could point anywhere on this machine
        files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path
    note = ""
    if not earlier_merge:
        # metrics.jsonl, (GRPO) rollouts.jsonl and training_config.json as of this step, with every
        # checkpoint: a run stopped or failed after it has them on its branch too. A Merge of an earlier
        # step goes at the branch's head, whose files are newer, and leaves them as they are.
        extra, note = run_record.branch_files(run, checkpoint)
        files.update(extra)
    repo = kept_run_repo(run)
    if repo is None:
        not_committed(run, checkpoint, label)
        return None
    message = checkpoint_message(checkpoint, label, earlier_merge)
    # A Merge a person asks for is committed whichever attempt's step it merges, each beside its own
    # step's files: at the head while that step's files are the ones there (the last merge asked for
    # is the one at the head), else on the step's own commit (merged_step_commit). What the engine
    # reported is committed in the order it reported it: one whose commit comes after a later one's
    # goes on the commit before that one (commit_before), as a commit at the head would hold the later
    # weights (and put an earlier attempt's files back over a newer attempt's, at the same step).
    later = None if checkpoint.requested else committed_after(checkpoint)
    try:
        if earlier_merge and (step_commit := merged_step_commit(checkpoint, repo)) is not None:
            # A later attempt saved this step again: at the branch's head, checkpoints/step-<n>/ holds
            # its files, and this merge beside them would be another attempt's weights (a download of
            # the commit, or of the step's folder, mixing the two). The merge goes on the commit that
            # holds its own step's files instead, moving no branch: its commit is that attempt's step
            # with its merge, which the checkpoint's `commit` (its Download) reaches.
            commit = commit_files_on(repo, step_commit, files, author=run.created_by, delete=left_over_files(checkpoint, repo, step_commit.pk, prefix, files),
                                     message=f"{message}, on attempt {checkpoint.attempt}'s own step {checkpoint.step} "
                                             f"(a later attempt saved step {checkpoint.step} again on {run_branch_name(run)})")
        elif later is not None:
            base = commit_before(later, repo)
            if base is None:
                log.warning("run %s: checkpoint %s not committed: checkpoint %s, reported after it, was committed first, and the commit before that one is gone",
                            run.pk, checkpoint.pk, later.pk)
                return None
            later_label = f"{checkpoint_label(later, checkpoint_prefix(later, is_earlier_merge(later)))} of attempt {later.attempt}"
            commit = commit_files_on(repo, base, files, author=run.created_by, delete=left_over_files(checkpoint, repo, base.pk, prefix, files),
                                     message=f"{message}, committed after {later_label}: on the commit before that one, off {run_branch_name(run)}, "
                                             f"so that it holds no later weights{note}")
            from training.services import add_log

            add_log(run, f"[studio] {label} of attempt {checkpoint.attempt} was committed after {later_label}: its commit {commit.pk[:10]} holds it "
                         f"on the commit before that one, off branch {run_branch_name(run)}, whose head does not have its files")
        else:
            commit = commit_files(repo, run_branch_name(run), files, message=message + note, author=run.created_by,
                                  delete=left_over_files(checkpoint, repo, run_branch_name(run), prefix, files))
        # The commit that holds this attempt's files, also once a later attempt's step replaces them on the branch.
        Checkpoint.objects.filter(pk=checkpoint.pk).update(commit=commit.pk)
    except repos.RefNotFound:
        if kept_run_repo(run) is not None:
            raise
        not_committed(run, checkpoint, label)  # the repo was deleted while the files were stored
        return None
    except OSError as exc:
        if not storage.disk_full(exc):
            raise  # transient I/O: the task retries
        storage_full(run, checkpoint, exc)
        return None
    if checkpoint.kind in MODEL_KINDS and not earlier_merge:
        _publish(run, checkpoint)  # the Models page shows the run's result, not an earlier step
    return commit


def checkpoint_folder(checkpoint) -> Path | None:
    """The checkpoint's folder, when it is one in its attempt's run folder on this machine (checkpoint_dir);
    a checkpoint anywhere else is never committed."""
    from training.backends.local import checkpoint_dir

    root = checkpoint_dir(checkpoint)
    if root is None:
        log.warning("run %s: checkpoint %s is not a folder in its attempt's run folder on this machine (%s): not committed",
                    checkpoint.run_id, checkpoint.pk, checkpoint.path)
    return root


def _publish(run, checkpoint) -> None:
    from training.models import Checkpoint

    try:
        published = publish_model(run, checkpoint)
    except OSError as exc:
        if not storage.disk_full(exc):
            raise  # transient I/O: the task retries, and publishes the commit it recorded
        storage_full(run, checkpoint, exc)
    except ApiError as exc:  # a Data Hub rule refused the repo or its files: a retry would meet it again
        publish_failed(run, checkpoint, exc)
    else:
        if published is not None:
            Checkpoint.objects.filter(pk=checkpoint.pk).exclude(publish_error="").update(publish_error="")


def publish_failed(run, checkpoint, exc: ApiError) -> None:
    """Say in the run's log, and on its Overview (Checkpoint.publish_error), that its result was not
    published and why; its files stay on its branch. Without this the worker's log alone had it, and
    the Overview called the repo that was never made "deleted"."""
    from training.models import Checkpoint
    from training.services import add_log

    reason = "; ".join([exc.detail.rstrip("."), *(finding.message for finding in exc.errors if not restates(exc.detail, finding.message))])
    log.warning("run %s: checkpoint %s not published: %s", run.pk, checkpoint.pk, reason)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(publish_error=reason[:PUBLISH_ERROR_MAX])
    add_log(run, f"[studio] {checkpoint.kind} (step {checkpoint.step}) of attempt {checkpoint.attempt} not published to model repo "
                 f"{model_repo_full_name(run)}: {reason}; its files are on branch {run_branch_name(run)}")


def restates(detail: str, message: str) -> bool:
    """Whether a finding's message opens by saying what the error's detail says already ("acme already
    has a repo X: choose another name" beside "Project acme already has a repo 'X'"): its advice is
    for the form's field (a publish's repo name is the run's, not chosen), and the reason said it twice."""
    said = message.partition(": ")[0].replace("'", "").casefold()
    return len(said.split()) >= 3 and said in detail.replace("'", "").casefold()  # a clause, not a field name that the detail mentions


def checkpoint_label(checkpoint, prefix: str) -> str:
    """How commit messages and the run's log name a checkpoint: "step 4", "final (step 4)", and a Merge a
    person asked for, beside step 4's files, "merge of step 4" (it was named as the step itself)."""
    if prefix.startswith("checkpoints/"):
        return f"merge of step {checkpoint.step}" if prefix.endswith("/merged") else f"step {checkpoint.step}"
    return f"{checkpoint.kind} (step {checkpoint.step})"


def checkpoint_message(checkpoint, label: str, earlier_merge: bool) -> str:
    """The commit message of a checkpoint: "Checkpoint step 4, attempt 1"; a Merge a person asked for
    says so, "Merged checkpoint step 4, attempt 1", not the message of the step's own commit."""
    if earlier_merge:
        return f"Merged checkpoint step {checkpoint.step}, attempt {checkpoint.attempt}"
    return f"Checkpoint {label}, attempt {checkpoint.attempt}"


def committed_after(checkpoint):
    """The first checkpoint of the run that its engine reported after `checkpoint` and that is
    committed already, if any (a Merge a person asked for is not: it goes where its own step is)."""
    return (type(checkpoint).objects.filter(run_id=checkpoint.run_id, pk__gt=checkpoint.pk, requested=False)
            .exclude(commit="").order_by("pk").first())


def commit_before(later, repo: Repo) -> Commit | None:
    """The parent of `later`'s commit: what the run's branch held before `later` was committed, so no
    checkpoint reported after the one committed there now. None when that commit is not in `repo`."""
    commit = Commit.objects.filter(repo=repo, pk=later.commit).first()
    parent = commit.parents[0] if commit is not None and commit.parents else None
    return Commit.objects.filter(repo=repo, pk=parent).first() if parent else None


def not_committed(run, checkpoint, label: str) -> None:
    from training.services import add_log

    log.warning("run %s: checkpoint %s not committed: its repo was deleted", run.pk, checkpoint.pk)
    add_log(run, f"[studio] {label} of attempt {checkpoint.attempt} not committed: {run_branch_gone(run)}; "
                 "its files stay in the run's folder until the run is deleted")


def later_attempt_at(checkpoint, prefix: str) -> int | None:
    """The newest later attempt of the run with a checkpoint whose files go to `prefix` too, if any."""
    later = type(checkpoint).objects.filter(run_id=checkpoint.run_id, step=checkpoint.step, kind=checkpoint.kind, attempt__gt=checkpoint.attempt)
    attempts = [c.attempt for c in later.order_by("-attempt") if checkpoint_prefix(c, is_earlier_merge(c)) == prefix]
    return attempts[0] if attempts else None


def merged_step_commit(checkpoint, repo: Repo) -> Commit | None:
    """For a Merge a person asked for (is_earlier_merge) of a step that a later attempt of the run
    saved again: the commit that holds the merged step's own files (its Checkpoint.commit), on which
    commit_checkpoint commits the merge. None when no later attempt saved the step (the merge goes on
    the branch's head, beside its own step's files), or when the step's commit is not known (committed
    before commits were recorded)."""
    from training.models import Checkpoint

    step = (Checkpoint.objects.filter(run_id=checkpoint.run_id, attempt=checkpoint.attempt, step=checkpoint.step, kind="checkpoint")
            .exclude(commit="").order_by("-id").first())
    if step is None or later_attempt_at(step, checkpoint_prefix(step, False)) is None:
        return None
    return Commit.objects.filter(repo=repo, pk=step.commit).first()


def left_over_files(checkpoint, repo: Repo, ref: str, prefix: str, files: Mapping[str, Any]) -> list[str]:
    """Files under `prefix` at `ref` (the run's branch, or the commit a merge goes on) that this
    checkpoint does not have: an earlier attempt saved the same step there (maybe with other files:
    lora_rank can be edited between attempts), and the folder must hold this attempt's files alone.
    The step's merge in prefix/merged/ stays when it is of this attempt (this commit runs again); an
    earlier attempt's goes with that attempt's step."""
    try:
        head = repos.resolve(repo, ref)
    except repos.RefNotFound:
        return []
    own_merge = type(checkpoint).objects.filter(run_id=checkpoint.run_id, step=checkpoint.step, kind="merged", attempt__gte=checkpoint.attempt).exists()
    keep = f"{prefix}/merged/" if checkpoint.kind == "checkpoint" and own_merge else None
    paths = TreeEntry.objects.filter(repos.under(prefix + "/"), commit=head).values_list("path", flat=True)
    return [path for path in paths if path not in files and not (keep and path.startswith(keep))]


MODEL_KINDS = ("final", "merged")  # a full fine-tune's final weights; a LoRA run's merged model
PUBLISH_ERROR_MAX = 500  # Checkpoint.publish_error's column
MODEL_REPO_RE = re.compile(r"-run(\d+)$")


# publish_model's commit message: what makes a model repo a run's, not its name alone (anyone may make
# a model repo called `notes-run14`, or one named like a deleted run's).
PUBLISH_MESSAGE = "Publish {kind} model from run #{run} (step {step})"
PUBLISH_RE = re.compile(r"Publish \w+ model from run #(\d+) \(step \d+\)")


# What a run's model repo name starts with when its name would start with repos.EXPERIMENT_PREFIX,
# kept for the experiments' own repos (create_repo refuses a model repo named so).
MODEL_PREFIX = "model-"


def model_repo_name(run) -> str:
    """The run's model repo: `<slug of its name>-run<id>`, or `model-experiment-…-run<id>` for a run
    whose name starts "Experiment" (its slug is in the experiments' repo namespace). What makes a repo
    the run's is its `-run<id>` and its publish commit (publishing_runs), not the rest of the name."""
    from django.utils.text import slugify

    name = f"{(slugify(run.name) or 'model')[:100].strip('-_') or 'model'}-run{run.pk}"
    return MODEL_PREFIX + name if name.lower().startswith(repos.EXPERIMENT_PREFIX) else name


def model_repo_full_name(run) -> str:
    """<project>/<model_repo_name>: how the run's log, Overview and API name its model repo."""
    return f"{run.project.slug}/{model_repo_name(run)}"


def publishing_runs(repos: Iterable[Repo]) -> dict[int, int]:
    """repo pk → the run that published to it: a model repo named `...-run<id>` (model_repo_name, kept
    when the run is renamed) holding a publish commit of that run."""
    named = {r.pk: int(m[1]) for r in repos if r.type == RepoType.MODEL and (m := MODEL_REPO_RE.search(r.name))}
    published: dict[int, int] = {}
    if named:
        for repo_id, message in Commit.objects.filter(repo_id__in=list(named), message__startswith="Publish ").values_list("repo_id", "message"):
            match = PUBLISH_RE.match(message)
            if match is not None and int(match[1]) == named[repo_id]:
                published[repo_id] = named[repo_id]
    return published


def published_repos(run) -> list[Repo]:
    """The model repos `run` published to, the one named as the run is now first, then newest first."""
    candidates = list(Repo.objects.filter(project_id=run.project_id, type=RepoType.MODEL, name__endswith=f"-run{run.pk}")
                      .select_related("project").order_by("-created_at")[:20])
    published = publishing_runs(candidates)
    return sorted((r for r in candidates if r.pk in published), key=lambda r: r.name != model_repo_name(run))


def published_model(run) -> tuple[Repo | None, str, str]:
    """The model repo the run's final or merged weights were published to (published_repos, as the
    Models page pairs them), or None; once that repo was deleted, its full name (model_repo_deleted),
    so a reader is told it went rather than that the run published nothing; and why its newest weights
    were not published (publish_failed), when a Data Hub rule refused them: such a repo was never
    made, so it is not "deleted"."""
    return published_models([run])[run.pk]


def publish_model(run, checkpoint) -> Commit | None:
    """Commit a run's final (or merged) weights to the project's model repo `<run-name>-run<id>`
    on main with a README.md model card: the Models page entry. Safe to run twice."""
    from training.backends.local import checkpoint_dir

    root = checkpoint_dir(checkpoint)  # where it lies now: the Studio's var/ may have moved since it was recorded
    if checkpoint.kind not in MODEL_KINDS or root is None:
        return None
    files: dict[str, FileSource] = {
        path.relative_to(root).as_posix(): path for path in sorted(root.rglob("*")) if path.is_file() and not path.is_symlink()
    }
    files["README.md"] = run_record.model_card(run, checkpoint, f"{run_repo(run).full_name}@{run_branch_name(run)}").encode()
    files["training_config.json"] = run_record.training_config(run, checkpoint)
    if repos.find_repo(run.project, model_repo_name(run)) is None and model_repo_deleted(run, checkpoint):
        not_published(run, checkpoint)
        return None
    repo = get_or_create_repo(run.project, model_repo_name(run), RepoType.MODEL, run.created_by)
    summary = f"{run.method} of {run.base_model or 'unknown'} (run #{run.pk})"
    if repo.description != summary:
        Repo.objects.filter(pk=repo.pk).update(description=summary)
    blobs = store_blobs(files)  # outside the transaction: slow I/O
    with transaction.atomic():
        # The model.published deliveries are made in the commit's transaction: a publish that lands
        # is told, once (publishing again commits nothing new, and tells nothing).
        head = Branch.objects.filter(repo=repo, name=MAIN).values_list("head_id", flat=True).first()
        commit = commit_blobs(repo, MAIN, blobs, message=PUBLISH_MESSAGE.format(kind=checkpoint.kind, run=run.pk, step=checkpoint.step), author=run.created_by)
        if commit.pk != head:
            webhooks.queue_event(run.project_id, WebhookEvent.MODEL_PUBLISHED, run.pk, lambda: model_published_data(run, repo, commit))
    return commit


def model_published_data(run, repo: Repo, commit: Commit) -> dict[str, Any]:
    """The `data` of a model.published webhook: the run, and the model repo and commit its weights
    are in now (what run.completed's published_model, sent before the publish, is mostly missing)."""
    from django.conf import settings
    from django.urls import reverse

    return {
        "run_id": run.pk,
        "name": run.name,
        "project": run.project.slug,
        "method": run.method,
        "model": repo.full_name,
        "commit": commit.pk,
        "url": run_record.run_url(run),
        "model_url": settings.STUDIO_PUBLIC_URL + reverse("datahub:repo", args=[repo.project.slug, repo.name]),
    }


def published_models(runs) -> dict[int, tuple[Repo | None, str, str]]:
    """published_model of each run, in a few queries for them all (the run list's page): the model
    repos published_repos would find, their publish commits, and the committed final and merged
    checkpoints that model_repo_deleted and the newest one's publish_error read, with the run's last step."""
    from django.db.models import Max, OuterRef, Subquery

    from training.models import Checkpoint

    runs = list(runs)
    if not runs:
        return {}
    wanted = {run.pk: run.project_id for run in runs}
    named = Q()
    for run in runs:
        named |= Q(project_id=run.project_id, name__endswith=f"-run{run.pk}")
    candidates: dict[int, list[Repo]] = {}
    for repo in Repo.objects.filter(named, type=RepoType.MODEL).select_related("project").order_by("-created_at"):
        match = MODEL_REPO_RE.search(repo.name)
        run_id = int(match[1]) if match else None
        if run_id is not None and wanted.get(run_id) == repo.project_id and len(candidates.setdefault(run_id, [])) < 20:  # published_repos' newest 20
            candidates[run_id].append(repo)
    published = publishing_runs([repo for repos_of in candidates.values() for repo in repos_of])
    last_step = Checkpoint.objects.filter(run_id=OuterRef("run_id")).values("run_id").annotate(last=Max("step")).values("last")
    models: dict[int, list] = {}
    for checkpoint in (Checkpoint.objects.filter(run_id__in=wanted, kind__in=MODEL_KINDS).exclude(commit="")
                       .annotate(last_step=Subquery(last_step)).order_by("-created_at", "-pk")):
        models.setdefault(checkpoint.run_id, []).append(checkpoint)
    found: dict[int, tuple[Repo | None, str, str]] = {}
    for run in runs:
        repo = next(iter(sorted((r for r in candidates.get(run.pk, []) if r.pk in published), key=lambda r: r.name != model_repo_name(run))), None)
        kept = models.get(run.pk, [])
        failed = kept[0].publish_error if kept else ""
        deleted = repo is None and not failed and any(not c.publish_error and not is_earlier_merge(c, c.last_step) for c in kept)
        found[run.pk] = (repo, model_repo_full_name(run) if deleted else "", failed if repo is None else "")
    return found


def model_repo_deleted(run, checkpoint=None) -> bool:
    """Whether the run published a model before `checkpoint` (another of its final or merged
    checkpoints was committed as its result; any, without it) and no model repo of the run is left:
    a person deleted it, and making it again would bring back a repo they removed."""
    from training.models import Checkpoint

    # A checkpoint whose publish failed (publish_error) made no repo: none was deleted.
    published = [earlier for earlier in Checkpoint.objects.filter(run_id=run.pk, kind__in=MODEL_KINDS, publish_error="").exclude(commit="")
                 .exclude(pk=getattr(checkpoint, "pk", None)) if not is_earlier_merge(earlier)]
    return bool(published) and not published_repos(run)


def not_published(run, checkpoint) -> None:
    from training.services import add_log

    log.warning("run %s: checkpoint %s not published: its model repo was deleted", run.pk, checkpoint.pk)
    add_log(run, f"[studio] {checkpoint.kind} (step {checkpoint.step}) of attempt {checkpoint.attempt} not published: model repo "
                 f"{model_repo_full_name(run)} was deleted, so nothing was published; its files are on branch {run_branch_name(run)}")


def storage_full(run, checkpoint, exc: OSError) -> None:
    """The blob storage is full. Nothing of the checkpoint was committed (blobs are written before
    the commit, and a short blob is removed), so fail the run now with what to do rather than let
    it train on and lose every later checkpoint too."""
    from training.backends import get_backend
    from training.models import ACTIVE_STATUSES, ErrorCode, TrainingRun
    from training.reconciler import end_failed

    log.error("run %s: blob storage full while committing checkpoint %s: %s", run.pk, checkpoint.pk, exc)
    run = TrainingRun.objects.get(pk=run.pk)
    if run.status in ACTIVE_STATUSES:
        end_failed(run, get_backend(run.backend_name), ErrorCode.TRAINING_ERROR,
                   f"the Data Hub's blob storage is full, so the checkpoint of step {checkpoint.step} could not be stored "
                   f"({exc.strerror}): free space under the Data Hub's storage (DATAHUB_ROOT) and start the run again")
