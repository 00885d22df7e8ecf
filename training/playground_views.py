"""The run page's Try it tab: ask the run's weights a prompt, and see the answers as a worker makes them
(training.playground). Each view: parse → authorise → one service → render (HTMX gets the partial)."""
from __future__ import annotations

import math
from typing import Any

from django.contrib import messages
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from studio.api import validate_data
from studio.auth import Actor
from studio.errors import ApiError, BadRequest, Conflict, NotFound
from studio.parsing import ascii_int
from studio.views import errors_by_field, form_action, htmx_fragment, studio_page, web_actor
from training import playground
from training.models import Checkpoint, Generation, TrainingRun
from training.queries import get_run_for
from training.schemas import GenerateIn

FORM_DEFAULTS = {"max_new_tokens": 128, "temperature": 0.7, "step": "", "compare_base": False}


def speaks_chat(run: TrainingRun, checkpoint: Checkpoint) -> bool:
    """Whether the weights' tokenizer has a chat template (the form then takes a chat message): read
    from their saved files, on this machine or on the run's Data Hub branch, without loading anything."""
    files = playground.saved_texts(run, checkpoint, ("chat_template.jinja", "tokenizer_config.json"))
    return "chat_template.jinja" in files or '"chat_template"' in files.get("tokenizer_config.json", "")


def try_context(run: TrainingRun, actor: Actor, values: dict[str, Any] | None = None, error: ApiError | None = None) -> dict[str, Any]:
    """The Try it tab: the form (with what was typed and its findings), why the run's weights cannot
    answer here when they cannot, and the run's kept answers, newest first."""
    steps = sorted(set(Checkpoint.objects.filter(run=run, kind__in=playground.STEP_KINDS).values_list("step", flat=True)))
    final = has_final(run)
    chat, unavailable = False, ""
    try:  # the weights the form starts on: the final ones, else the newest step
        weights = playground.weights_of(run, None if final or not steps else steps[-1])
        playground.model_args(run, weights)
        chat = speaks_chat(run, weights)
    except ApiError as exc:
        unavailable = exc.detail
    choices = ([("", "Final weights")] if final else []) + [(str(s), f"Step {s}") for s in steps]
    generations = list(run.generations.select_related("checkpoint")[:playground.KEPT_GENERATIONS])
    playground.count_answers_ahead(generations)
    return {
        "writable": actor.can_write(run.project), "unavailable": unavailable, "chat": chat,
        "form": {"values": {**FORM_DEFAULTS, **(values or {})}, "errors": errors_by_field(error) if isinstance(error, BadRequest) else {}},
        "step_choices": choices, "refusal": error.detail if isinstance(error, Conflict) else "",
        "generations": generations,
        "timeout": playground.GENERATION_TIMEOUT_SECONDS,
    }


def has_final(run: TrainingRun) -> bool:
    return Checkpoint.objects.filter(run=run, kind__in=playground.END_KINDS, requested=False).exists()


def number(text: str) -> Any:
    """A form's number as the API would get it: an int, a float, or the text itself (GenerateIn then
    says it is not a number)."""
    whole = ascii_int(text)
    if whole is not None:
        return whole
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def ask_of(request: HttpRequest, chat: bool) -> dict[str, Any]:
    """The form's fields as GenerateIn's: the text box is one user message for a chat model (a blank one
    is a missing prompt), plain text otherwise."""
    text = request.POST.get("prompt", "")
    ask: dict[str, Any] = {"max_new_tokens": number(request.POST.get("max_new_tokens", "")), "temperature": number(request.POST.get("temperature", "")),
                           "step": number(request.POST["step"]) if request.POST.get("step") else None, "compare_base": "compare_base" in request.POST}
    if chat and text.strip():
        ask["messages"] = [{"role": "user", "content": text}]
    else:
        ask["prompt"] = text
    return ask


# htmx stops polling an element whose answer has this status (and swaps the answer in).
STOP_POLLING = 286


def try_page(request: HttpRequest, run_id: int, *args: Any, **kwargs: Any) -> str:
    return reverse("training:run_tab", args=[run_id, "try"])


@studio_page
@form_action(try_page)
def generate(request: HttpRequest, run_id: int) -> HttpResponse:
    """Try it's Generate: the ask recorded and queued (the tab then polls its answer), or the form again
    with each finding by its field (400) or why the run cannot answer (409)."""
    actor = web_actor(request)
    run = get_run_for(actor, run_id, write=True)
    chat = request.POST.get("format") == "chat"
    values = {key: request.POST.get(key, "") for key in ("prompt", "max_new_tokens", "temperature", "step")} | {"compare_base": "compare_base" in request.POST}
    error: ApiError | None = None
    try:
        ask = validate_data(GenerateIn, ask_of(request, chat)).model_dump()
        playground.request_generation(run, actor.user, ask)
        values = {**values, "prompt": ""}
    except ApiError as exc:
        error = exc
    if not request.htmx:
        if error is not None:
            messages.error(request, error.detail + "".join(f" {f.field}: {f.message}" for f in error.errors))
        return redirect("training:run_tab", run_id=run.pk, tab="try")
    context = {"run": run, **try_context(run, actor, values, error)}
    return render(request, "training/run_detail.html#playground", context, status=error.status if error else 200)


@studio_page
@htmx_fragment(try_page)
@require_GET
def generation(request: HttpRequest, run_id: int, generation_id: int) -> HttpResponse:
    """One answer, polled by the tab until a worker has made it. A run deleted (in another tab, by a
    teammate) or an answer no longer kept ends the poll (STOP_POLLING) with a card saying so: a 404
    is not swapped in, so the card said "Generating…" and polled every 2 s for as long as it was open."""
    try:
        run = get_run_for(web_actor(request), run_id)
    except NotFound as exc:
        return render(request, "training/run_detail.html#generation_gone", {"generation_id": generation_id, "gone": exc.detail,
                      "hint": "It may have been deleted since this page was loaded (in another tab, or by a teammate).",
                      "runs_url": reverse("training:runs")}, status=STOP_POLLING)
    found = Generation.objects.select_related("checkpoint").filter(pk=generation_id, run=run).first()
    if found is None:
        return render(request, "training/run_detail.html#generation_gone", {"generation_id": generation_id, "gone": no_answer(run, generation_id),
                      "hint": "", "runs_url": ""}, status=STOP_POLLING)
    playground.count_answers_ahead([found])
    return render(request, "training/run_detail.html#generation", {"run": run, "g": found, "timeout": playground.GENERATION_TIMEOUT_SECONDS})


def no_answer(run: TrainingRun, generation_id: int) -> str:
    """Why `run` shows no answer `generation_id`. A pruned answer leaves no trace, so the run's own
    kept answers tell: only an id older than its oldest kept one, with the run full, may have been
    its own. Whether the id is another run's is not looked up (it may be another project's)."""
    kept = run.generations.aggregate(count=Count("pk"), oldest=Min("pk"))
    if kept["count"] >= playground.KEPT_GENERATIONS and generation_id < kept["oldest"]:
        return (f"Run {run.pk} has no answer {generation_id}: it keeps only its newest {playground.KEPT_GENERATIONS} answers, "
                "so if this was one of its own, it has been deleted.")
    return f"Run {run.pk} has no answer {generation_id}."
