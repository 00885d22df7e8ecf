"""Try it: answer a prompt with a run's trained weights (and, to compare, its base model).

The web request only checks the ask and records a Generation; a Celery task answers it with the
engine's generator (training.engine.generate) in a process of its own with a timeout, so the worker
never holds weights and a model too large for the machine cannot hang it. The generator takes a free
GPU slot of this machine (the local backend's slot lock files) or, when training holds them all, the
CPU, and the answer says which and why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from datahub import storage
from datahub.checkouts import checked_out
from datahub.models import Branch, Commit, TreeEntry, blob_path
from datahub.refs import gone_pins, is_hub_ref, pin_deleted
from datahub.services import checkpoint_prefix, experiment_repo_name, is_earlier_merge, run_branch_name
from studio.celery import answers_queue
from studio.errors import ApiError, BadRequest, Conflict, Finding
from studio.queue import send_after_commit
from training.backends.local import REPO_ROOT, checkpoint_dir, engine_env, local_gpu_devices, slots_dir
from training.backends.local_runner import try_slots, waiting_before
from training.checkpoints import die_with_parent
from training.engine.reporter import storable
from training.models import Checkpoint, Generation, Status, TrainingRun
from training.services import attempt_record

KEPT_GENERATIONS = 20
MAX_NEW_TOKENS = 512
MAX_TEMPERATURE = 2.0
MAX_PROMPT_CHARS = 20_000
GENERATION_TIMEOUT_SECONDS = 120
# The answering task's time limit (two generator processes at most: the run's weights, then its base),
# past which an answer still running lost its worker; one queued this long was lost before a worker took it.
ANSWER_TIME_LIMIT_S = 2 * GENERATION_TIMEOUT_SECONDS + 90
QUEUED_LOST_AFTER_S = 30 * 60
# The run's own end weights, best first: full weights load alone, an adapter needs its base.
END_KINDS = ("final", "merged", "adapter")
# A saved step: its merged copy (a full model, Merge on the Checkpoints tab) before the step itself.
STEP_KINDS = ("merged", "checkpoint")


def ask_findings(ask: dict[str, Any]) -> list[Finding]:
    """What is wrong with a Try it ask (GenerateIn's fields): the API's 400 and the tab's form alike."""
    findings = []
    prompt, chat = ask.get("prompt"), ask.get("messages")
    if prompt is not None and chat is not None:
        findings.append(Finding("messages", "send a plain-text prompt or a chat's messages, not both"))
    elif chat is not None and not chat:
        findings.append(Finding("messages", "give at least one message, e.g. [{\"role\": \"user\", \"content\": \"Hi\"}]"))
    elif chat is None and not (prompt or "").strip():
        findings.append(Finding("prompt", "write something for the model to answer (or send messages for a chat)"))
    text = prompt or "".join(m["content"] for m in chat or [])
    if len(text) > MAX_PROMPT_CHARS:
        findings.append(Finding("messages" if chat else "prompt", f"at most {MAX_PROMPT_CHARS:,} characters ({len(text):,} given)"))
    tokens = ask["max_new_tokens"]
    if not 1 <= tokens <= MAX_NEW_TOKENS:
        findings.append(Finding("max_new_tokens", f"at least 1 and at most {MAX_NEW_TOKENS} ({tokens} given)"))
    temperature = ask["temperature"]
    if not 0 <= temperature <= MAX_TEMPERATURE:
        findings.append(Finding("temperature", f"at least 0 (0 always picks the likeliest token) and at most {MAX_TEMPERATURE:g} ({temperature:g} given)"))
    return findings


def weights_of(run: TrainingRun, step: int | None) -> Checkpoint:
    """The saved weights an ask names: the run's end weights (step None), or saved step `step`; the
    newest attempt's, full weights before an adapter. 409 when the run has none yet, 400 for a step it
    did not save."""
    saved = list(Checkpoint.objects.filter(run=run))
    kinds = END_KINDS if step is None else STEP_KINDS
    fits = [c for c in saved if c.kind in kinds and (c.step == step if step is not None else not c.requested)]
    if fits:
        return min(fits, key=lambda c: (-c.attempt, kinds.index(c.kind)))
    steps = sorted({c.step for c in saved if c.kind in STEP_KINDS})
    if step is not None:
        listed = f"run {run.pk} saved steps {', '.join(map(str, steps))}: give one of those" if steps else f"run {run.pk} saved no step along the way"
        raise BadRequest(f"Run {run.pk} has no saved step {step}.", [Finding("step", f"{listed}, or leave step out for its final weights")])
    if run.status in (Status.FAILED, Status.CANCELLED):  # it will save no final weights unless it trains again
        ended = f"Run {run.pk} ended {'cancelled (stopped)' if run.status == Status.CANCELLED else 'failed'} before saving its final weights"
        if steps:
            raise Conflict(f"{ended}: try one of its saved steps ({', '.join(map(str, steps))}) with step, or Resume from one of them "
                           "(Checkpoints tab) or Start it again, and try the new run's final weights once it completes.")
        raise Conflict(f"{ended}, and it saved no step along the way: Start it again{save_steps_hint(run)}, then try it once it completes.")
    if steps:
        raise Conflict(f"Run {run.pk} has no final weights yet (it saves them when its training ends): try one of its saved steps "
                       f"({', '.join(map(str, steps))}) with step, or wait for the run to finish.")
    raise Conflict(f"Run {run.pk} has no saved weights to try: start it and let it finish{save_steps_hint(run)}, then try it.")


def save_steps_hint(run: TrainingRun) -> str:
    """What the no-weights 409s add on saved steps: how to get some, unless the run already asks for
    them (it ended before its first save; the advice to set save_steps sent the user to what was there)."""
    every = (run.config or {}).get("save_steps")
    if every:
        return f" (it saves a step every {every} steps: it ended before its first)" if run.status in (Status.FAILED, Status.CANCELLED) else ""
    return " (with save_steps in its config it also saves steps along the way)"


@dataclass(frozen=True)
class HubFolder:
    """Weights in the Data Hub: the files of `commit` under `folder` ("" for all), which the answering
    task checks out on this machine (datahub.checkouts) and gives the generator as a folder."""

    commit: str
    folder: str = ""


# A generator's model argument: a local folder or an HF id as it is, or a Data Hub folder to check out first.
Weights = str | HubFolder


def base_model_of(run: TrainingRun, attempt: int, what: str, instead: str) -> Weights:
    """The base model attempt `attempt` trained from, as the generator loads it: an HF id or a local
    folder, or for a Data Hub ref the commit START pinned it to (the run's log: `trains from base_model
    demo-student@main = demo/demo-student@<commit>`), whatever its branch holds now. 409 when that
    commit went with its repo, or the attempt pinned none; `instead` says what the user can ask instead."""
    record = attempt_record(run, attempt)
    base = record.base_model
    if not is_hub_ref(base):
        return base
    pin = (record.pinned or {}).get("base_model")
    if not isinstance(pin, dict) or pin.get("ref") != base or not pin.get("commit") or not pin.get("repo"):
        raise Conflict(f"Run {run.pk}'s base model {base} was not pinned to a commit when attempt {attempt} started, so {what}. {instead}")
    if gone_pins({"base_model": pin}):
        raise Conflict(f"Run {run.pk}'s base model {base}: {pin_deleted(pin)}, so {what}. {instead}")
    return HubFolder(pin["commit"])


def committed_weights(run: TrainingRun, checkpoint: Checkpoint) -> tuple[HubFolder, bool]:
    """Weights that are not on this machine (a dstack or Modal job saved them on its own) as the run's
    Data Hub branch holds them: the commit the checkpoint recorded, else the branch's head while no
    later attempt saved the same step there; with whether they are a LoRA adapter. 409 when they are
    not there."""
    repo_name, branch = experiment_repo_name(run.experiment), run_branch_name(run)
    folder = checkpoint_prefix(checkpoint, is_earlier_merge(checkpoint))
    where = f"{checkpoint.kind}, step {checkpoint.step}"
    if checkpoint.commit:
        if not Commit.objects.filter(repo__project_id=run.project_id, repo__name=repo_name, pk=checkpoint.commit).exists():
            raise Conflict(f"Run {run.pk}'s weights ({where}) were in commit {checkpoint.commit[:12]} of Data Hub repo {repo_name}, "
                           "which was deleted with its repo: those files are gone, so they cannot be tried. Try another saved step, or train the run again.")
        commit = checkpoint.commit
    else:
        head = Branch.objects.filter(repo__project_id=run.project_id, repo__name=repo_name, name=branch).values_list("head_id", flat=True).first()
        replaced = Checkpoint.objects.filter(run=run, step=checkpoint.step, kind=checkpoint.kind, attempt__gt=checkpoint.attempt).exists()
        if head is None or replaced or not TreeEntry.objects.filter(commit_id=head, path__startswith=f"{folder}/").exists():
            raise Conflict(f"Run {run.pk}'s weights ({where}) are not on the Studio machine: its {run.backend_name} job saved them on its own, "
                           f"and branch {branch} of Data Hub repo {repo_name} does not hold {'them' if replaced else folder + '/'}"
                           f"{' (a later attempt saved that step again)' if replaced else ''}. Try another saved step, or its final weights.")
        commit = head
    adapter = TreeEntry.objects.filter(commit_id=commit, path=f"{folder}/adapter_config.json").exists()
    return HubFolder(commit, folder), adapter


def model_args(run: TrainingRun, checkpoint: Checkpoint) -> list[Weights]:
    """The generator's --model (and --adapter) for these weights: their folder on this machine, or the
    run's Data Hub branch (committed_weights), and for a LoRA adapter its base (base_model_of)."""
    folder = checkpoint_dir(checkpoint)
    weights: Weights
    if folder is None:
        weights, adapter = committed_weights(run, checkpoint)
    else:
        weights, adapter = str(folder), (folder / "adapter_config.json").is_file()
    if adapter:
        return ["--model", base_model_of(run, checkpoint.attempt, f"the LoRA adapter of step {checkpoint.step} has no base to go over",
                                                    "Try the run's final weights (a LoRA run's merged model loads alone), or Merge this step on the "
                                                    "Checkpoints tab and try it."), "--adapter", weights]
    return ["--model", weights]


def saved_texts(run: TrainingRun, checkpoint: Checkpoint, names: tuple[str, ...]) -> dict[str, str]:
    """The small text files `names` that these weights saved beside them (on this machine, or on the
    run's Data Hub branch), by name; those they lack, or weights Try it cannot load, are left out."""
    folder = checkpoint_dir(checkpoint)
    if folder is not None:
        return {name: (folder / name).read_text(errors="replace") for name in names if (folder / name).is_file()}
    try:
        weights, _ = committed_weights(run, checkpoint)
    except ApiError:
        return {}
    entries = TreeEntry.objects.filter(commit_id=weights.commit, path__in=[f"{weights.folder}/{name}" for name in names])
    texts = {}
    for path, sha256 in entries.values_list("path", "blob__sha256"):
        with storage.open_blob(blob_path(sha256)) as blob:
            texts[path.rpartition("/")[2]] = blob.read().decode(errors="replace")
    return texts


def sources_of(generation: Generation) -> list[tuple[str, list[Weights]]]:
    """(which, the generator's model arguments) for each model that answers: the run's weights, then
    its base when asked to compare. Raises what the ask would be refused with now."""
    run, checkpoint = generation.run, generation.checkpoint
    if checkpoint is None:
        raise Conflict("The weights this was asked of were deleted: ask again.")
    sources = [("trained", model_args(run, checkpoint))]
    if generation.compare_base:
        sources.append(("base", ["--model", base_model_of(run, checkpoint.attempt, "its answer cannot be compared with the base model's",
                                                         "Untick Compare with the base model to try the run's weights alone.")]))
    return sources


@transaction.atomic
def request_generation(run: TrainingRun, user, ask: dict[str, Any]) -> Generation:
    """Record an ask (GenerateIn's fields) and queue its answer after commit; 400 naming each bad
    field, 409 when the run has no weights that can answer here. A run keeps its KEPT_GENERATIONS
    newest; the older ones go."""
    findings = ask_findings(ask)
    if findings:
        raise BadRequest("The request to try the model has invalid fields.", findings)
    checkpoint = weights_of(run, ask["step"])
    generation = Generation(run=run, created_by=user, checkpoint=checkpoint, step=ask["step"], prompt=ask.get("prompt") or "",
                            messages=ask.get("messages"), max_new_tokens=ask["max_new_tokens"], temperature=ask["temperature"],
                            compare_base=ask["compare_base"])
    sources_of(generation)  # the 409s, before anything is stored
    generation.save()
    kept = list(Generation.objects.filter(run=run).values_list("pk", flat=True)[:KEPT_GENERATIONS])
    Generation.objects.filter(run=run).exclude(pk__in=kept).delete()
    from training.tasks import generate_answer

    send_after_commit(generate_answer, generation.pk, on_unsent=lambda: unsent_answer(generation))
    return generation


QUEUE_DOWN_ANSWER = "the task queue (Redis) could not be reached, so no worker got it: ask again once it is back"


def unsent_answer(generation: Generation) -> None:
    """Fail an ask whose task the broker did not take (nothing would send it again), here and on the
    object request_generation answers with."""
    generation.status, generation.finished_at, generation.error = Generation.State.FAILED, timezone.now(), QUEUE_DOWN_ANSWER
    Generation.objects.filter(pk=generation.pk, status=Generation.State.QUEUED).update(
        status=generation.status, finished_at=generation.finished_at, error=generation.error)


def generate(generation_id: int) -> None:
    """Answer a queued Generation (the task's body; a second run of it finds it claimed and does nothing)."""
    if not Generation.objects.filter(pk=generation_id, status=Generation.State.QUEUED).update(status=Generation.State.RUNNING, started_at=timezone.now()):
        return
    generation = Generation.objects.select_related("run", "run__experiment", "checkpoint").get(pk=generation_id)
    request = {"prompt": generation.prompt, "messages": generation.messages, "max_new_tokens": generation.max_new_tokens,
               "temperature": generation.temperature}
    with ExitStack() as checkouts:
        try:
            sources = [(which, [local(checkouts, a) for a in args]) for which, args in sources_of(generation)]
        except ApiError as exc:  # the weights went between the ask and now
            finish(generation, [], exc.detail)
            return
        except FileNotFoundError as exc:  # their repo was deleted while they were checked out
            finish(generation, [], f"the weights' files went from the Data Hub while they were read ({exc.strerror}): ask again")
            return
        except Exception as exc:  # a full disk: the tab must not poll "Generating…" for ever
            finish(generation, [], f"the worker failed to read the weights from the Data Hub ({type(exc).__name__}: {exc}): ask again")
            raise
        outputs: list[dict[str, Any]] = []
        try:
            with generation_gpu(generation) as (visible, note):
                for which, args in sources:
                    answer = run_generator(args, request, visible)
                    outputs.append({"model": which, **answer, **({"device_note": note} if note and "device" in answer else {})})
        except Exception as exc:  # the task's time limit, a slot file it cannot write: the tab must not poll "Generating…" for ever
            finish(generation, outputs, f"the worker failed while answering ({type(exc).__name__}: {exc}): ask again")
            raise
    failed = [f"{o['model']}: {o['error']}" for o in outputs if "error" in o]
    finish(generation, outputs, "; ".join(failed))


def local(checkouts: ExitStack, weights: Weights) -> str:
    """A generator argument on this machine: a Data Hub folder checked out, and kept until `checkouts` closes."""
    if isinstance(weights, HubFolder):
        return str(checkouts.enter_context(checked_out(weights.commit, weights.folder)))
    return weights


def finish(generation: Generation, outputs: list[dict], error: str) -> None:
    """Store the answer. A model's text can hold a NUL (an untrained model's tokens decode to any bytes),
    which PostgreSQL stores in no text or JSON: the update failed and left the answer "Generating…"."""
    Generation.objects.filter(pk=generation.pk).update(
        status=Generation.State.FAILED if error else Generation.State.COMPLETED, outputs=storable(outputs), error=storable(error),
        finished_at=timezone.now())


@contextmanager
def generation_gpu(generation: Generation) -> Iterator[tuple[str, str]]:
    """(CUDA_VISIBLE_DEVICES for the generator, why it runs on the CPU or "") while the answer is made.
    A GPU only when one of this machine's slots is free and no training job waits for one, held as a
    training job holds it (its slot lock) until the answer is done: training always has the GPUs it
    queued for, and an answer meanwhile runs on the CPU, slower."""
    devices = local_gpu_devices()
    if not devices:
        yield "", "on the CPU: the Studio machine has no GPU"
        return
    slots = slots_dir()
    slots.mkdir(parents=True, exist_ok=True)
    waiting = waiting_before(slots / "queue-gpu" / f"{time.time_ns():020d}.ticket") if (slots / "queue-gpu").is_dir() else []
    held, holders = ([], []) if waiting else try_slots([slots / f"gpu-{d}.lock" for d in devices], 1)
    if not held:
        busy = f"training jobs wait for them ({', '.join(waiting)})" if waiting else f"training holds them ({', '.join(sorted(set(holders)))})"
        yield "", f"on the CPU: every GPU of the Studio machine is taken, {busy}"
        return
    slot = held[0]
    try:
        slot.seek(0)
        slot.truncate()
        slot.write(f"Try it of run {generation.run_id} (answer {generation.pk})")
        slot.flush()
        yield Path(slot.name).stem.removeprefix("gpu-"), ""
    finally:
        slot.close()


def run_generator(args: list[str], request: dict[str, Any], visible: str) -> dict[str, Any]:
    """One model's answer from the engine's generator process: {"text", "tokens", "seconds", "device"},
    or {"error"} saying why there is none."""
    command = [sys.executable, "-m", "training.engine.generate", *args]
    try:
        done = subprocess.run(command, input=json.dumps(request), cwd=REPO_ROOT, env=engine_env({"CUDA_VISIBLE_DEVICES": visible}),
                              capture_output=True, text=True, timeout=GENERATION_TIMEOUT_SECONDS, preexec_fn=partial(die_with_parent, os.getpid()))
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {GENERATION_TIMEOUT_SECONDS} s, so it was stopped: the model is too large or too slow for "
                         f"{'a GPU' if visible else 'the CPU'} of the Studio machine; ask for fewer max_new_tokens, or try it where it fits"}
    if done.returncode != 0:
        said = [line for line in done.stderr.strip().splitlines() if line.strip()][-3:]
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        return {"error": f"the generator failed ({how})" + (": " + " | ".join(said) if said else "")}
    return json.loads(done.stdout.strip().splitlines()[-1])


def fail_lost_answers() -> int:
    """Fail the answers no worker will finish (the reconciler's pass): running past the task's time
    limit (its worker process was killed, or the machine restarted), or queued for QUEUED_LOST_AFTER_S
    (the queue lost the task). The tab stops polling "Generating…" and says to ask again."""
    now = timezone.now()
    lost = Generation.objects.filter(status=Generation.State.RUNNING, started_at__lt=now - timedelta(seconds=ANSWER_TIME_LIMIT_S + 30))
    waited = Generation.objects.filter(status=Generation.State.QUEUED, created_at__lt=now - timedelta(seconds=QUEUED_LOST_AFTER_S))
    failed = lost.update(status=Generation.State.FAILED, finished_at=now,
                         error=f"the worker answering it stopped without an answer (still running after {ANSWER_TIME_LIMIT_S} s): ask again")
    # Most often no worker serves the answers queue: a deployment that runs only the main worker.
    return failed + waited.update(status=Generation.State.FAILED, finished_at=now,
                                  error=f"no worker took it within {QUEUED_LOST_AFTER_S // 60} minutes: start the Studio's answers worker "
                                        f"(`celery -A studio worker -Q {answers_queue()} -c 1`, as `make studio` does) if none runs, then ask again")


def count_answers_ahead(generations: list[Generation]) -> None:
    """Set `ahead` on each queued answer of `generations`: how many answers asked before it (of any run:
    they share the answers queue, which takes them in turn) are still queued or being made."""
    queued = [g for g in generations if g.status == Generation.State.QUEUED]
    if not queued:
        return
    unfinished = sorted(Generation.objects.filter(status__in=(Generation.State.QUEUED, Generation.State.RUNNING),
                                                  pk__lt=max(g.pk for g in queued)).values_list("pk", flat=True))
    for generation in queued:
        generation.ahead = bisect_left(unfinished, generation.pk)
