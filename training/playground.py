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
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from datahub.refs import is_hub_ref
from datahub.services import experiment_repo_name, run_branch_name
from studio.celery import answers_queue
from studio.errors import ApiError, BadRequest, Conflict, Finding
from training.backends.local import REPO_ROOT, checkpoint_dir, engine_env, local_gpu_devices, slots_dir
from training.backends.local_runner import try_slots, waiting_before
from training.checkpoints import die_with_parent
from training.models import Checkpoint, Generation, Status, TrainingRun
from training.services import attempt_settings

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
        raise Conflict(f"{ended}, and it saved no step along the way: Start it again (with save_steps in its config it also saves steps "
                       "along the way), then try it once it completes.")
    if steps:
        raise Conflict(f"Run {run.pk} has no final weights yet (it saves them when its training ends): try one of its saved steps "
                       f"({', '.join(map(str, steps))}) with step, or wait for the run to finish.")
    raise Conflict(f"Run {run.pk} has no saved weights to try: start it and let it finish (with save_steps in its config it also saves "
                   "steps along the way), then try it.")


def base_model_of(run: TrainingRun, attempt: int, what: str) -> str:
    """The base model attempt `attempt` trained from, as the generator loads it: an HF id or a local
    folder. 409 for a Data Hub ref, which only a run's engine reads (over /hub, with its own token)."""
    base = attempt_settings(run, attempt)["base_model"]
    if is_hub_ref(base):
        raise Conflict(f"Run {run.pk}'s base model {base} is a Data Hub ref, which Try it cannot load yet, so {what}. "
                       "Try the run's final weights (a LoRA run's merged model loads alone), or Merge a saved step on the Checkpoints tab and try that step.")
    return base


def model_args(run: TrainingRun, checkpoint: Checkpoint) -> list[str]:
    """The generator's --model (and --adapter) for these weights. 409 when they are not on this machine:
    a dstack or Modal job saved them on its own, and they are in the run's Data Hub branch."""
    folder = checkpoint_dir(checkpoint)
    if folder is None:
        raise Conflict(f"Run {run.pk}'s weights ({checkpoint.kind}, step {checkpoint.step}) are not on the Studio machine: its "
                       f"{run.backend_name} job saved them on its own. They are committed to branch {run_branch_name(run)} of Data Hub repo "
                       f"{experiment_repo_name(run.experiment)}: download them from the Checkpoints tab and try them where they fit, "
                       "e.g. with `python -m training.engine.generate --model FOLDER`.")
    if (folder / "adapter_config.json").is_file():
        return ["--model", base_model_of(run, checkpoint.attempt, f"the LoRA adapter of step {checkpoint.step} has no base to go over"), "--adapter", str(folder)]
    return ["--model", str(folder)]


def sources_of(generation: Generation) -> list[tuple[str, list[str]]]:
    """(which, the generator's model arguments) for each model that answers: the run's weights, then
    its base when asked to compare. Raises what the ask would be refused with now."""
    run, checkpoint = generation.run, generation.checkpoint
    if checkpoint is None:
        raise Conflict("The weights this was asked of were deleted: ask again.")
    sources = [("trained", model_args(run, checkpoint))]
    if generation.compare_base:
        sources.append(("base", ["--model", base_model_of(run, checkpoint.attempt, "its answer cannot be compared with the base model's")]))
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

    transaction.on_commit(lambda: generate_answer.delay(generation.pk))
    return generation


def generate(generation_id: int) -> None:
    """Answer a queued Generation (the task's body; a second run of it finds it claimed and does nothing)."""
    if not Generation.objects.filter(pk=generation_id, status=Generation.State.QUEUED).update(status=Generation.State.RUNNING, started_at=timezone.now()):
        return
    generation = Generation.objects.select_related("run", "run__experiment", "checkpoint").get(pk=generation_id)
    try:
        sources = sources_of(generation)
    except ApiError as exc:  # the weights went between the ask and now
        finish(generation, [], exc.detail)
        return
    request = {"prompt": generation.prompt, "messages": generation.messages, "max_new_tokens": generation.max_new_tokens,
               "temperature": generation.temperature}
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


def finish(generation: Generation, outputs: list[dict], error: str) -> None:
    Generation.objects.filter(pk=generation.pk).update(
        status=Generation.State.FAILED if error else Generation.State.COMPLETED, outputs=outputs, error=error, finished_at=timezone.now())


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
