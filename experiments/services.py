"""The only functions that create experiments."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils.text import slugify

from datahub.models import Repo, RepoType
from datahub.repos import EXPERIMENT_PREFIX
from datahub.services import provision_experiment_repo
from experiments.models import Experiment
from studio import audit
from studio.errors import BadRequest, Conflict, Finding
from studio.models import AuditEvent, Project
from studio.parsing import ascii_int, control_character, hidden_character_problem

DEFAULT_EXPERIMENT = "default"
NAME_MAX = Experiment._meta.get_field("name").max_length


def create_experiment(project: Project, name: str) -> Experiment:
    name = (name or "").strip()
    slug = slugify(name)[:100]
    if not name:
        raise BadRequest(errors=[Finding("name", "give the experiment a name, e.g. tone-sweep")])
    if len(name) > NAME_MAX:  # the API's schema says so too; the page's form comes straight here
        raise BadRequest(errors=[Finding("name", f"an experiment name has at most {NAME_MAX} characters; this one has {len(name)}")])
    if (control := control_character(name)) is not None:
        raise BadRequest(errors=[Finding("name", f"an experiment name is one line of text: remove the control character U+{ord(control):04X} (a newline or tab, say)")])
    if hidden := hidden_character_problem(name, "an experiment name"):
        raise BadRequest(errors=[Finding("name", hidden)])
    if not slug:
        # The slug names the experiment's Data Hub repo (experiment-<slug>), which allows ASCII only.
        raise BadRequest(errors=[Finding("name", f"{name!r} has no ASCII letter or digit: the name becomes a Data Hub repo name, which keeps only "
                                                 "ASCII letters, digits, '-' and '_' (spaces become '-'); use at least one of a-z or 0-9, e.g. tone-sweep")])
    if slug.isdigit():
        # A run names its experiment by id or slug, the id first ("experiment": "1" is experiment id 1),
        # so an experiment whose slug is a number could be shadowed by another's id and never picked.
        raise BadRequest(errors=[Finding("name", f"{name!r} becomes the slug {slug!r}, only digits, which reads as an experiment id where a run names "
                                                 f"its experiment: add a letter, e.g. exp-{slug}")])
    repo_name = f"{EXPERIMENT_PREFIX}{slug}"
    clash = Repo.objects.filter(project=project, name=repo_name).exclude(type=RepoType.EXPERIMENT).first()
    if clash is not None:
        # The experiment would adopt it: its runs would commit their models to branches of that repo.
        raise Conflict(f"Project {project.slug} has a {clash.type} repo {repo_name!r}, the name this experiment's Data Hub repo needs.", [
            Finding("name", f"choose another experiment name, or rename or delete the {clash.type} repo {repo_name} in the Data Hub first")])
    try:
        with transaction.atomic():
            experiment = Experiment.objects.create(project=project, name=name, slug=slug)
            audit.record(AuditEvent.Action.CREATED, experiment, details={"slug": slug})
    except IntegrityError as exc:
        # Names are told apart by their slug: "bad name?" clashes with "bad name!", which the list shows by name.
        existing = Experiment.objects.filter(project=project, slug=slug).values_list("name", flat=True).first() or slug
        cut = ", the first 100 characters of both slugs" if len(slugify(name)) > 100 else ""
        raise Conflict(
            f"Project {project.slug} already has an experiment {existing!r}, whose slug {slug!r} this name shares{cut}.",
            [Finding("name", f"choose a name that differs in letters or digits, or use the existing experiment {existing!r}")],
        ) from exc
    provision_experiment_repo(experiment)
    return experiment


def default_experiment(project: Project) -> Experiment:
    """The project's `default` experiment, made on first use."""
    experiment = Experiment.objects.filter(project=project, slug=DEFAULT_EXPERIMENT).first()
    if experiment is not None:
        return experiment
    try:
        return create_experiment(project, DEFAULT_EXPERIMENT)
    except Conflict:  # created concurrently by another request
        return Experiment.objects.get(project=project, slug=DEFAULT_EXPERIMENT)


def find_experiment(project: Project, key: str | int) -> Experiment | None:
    """An experiment of `project` by id, slug or name; a string of digits is an id first. Names whose
    slug is only digits are refused at create, so no slug can be shadowed by an id; one made before
    that rule is still found by its own id (the list and the pages give it)."""
    qs = Experiment.objects.filter(project=project)
    if isinstance(key, str) and "\x00" in key:
        return None  # no experiment has such a name, and PostgreSQL cannot compare text with a NUL
    if isinstance(key, bool):
        return None  # True is an int to Python, never an experiment id
    pk = key if isinstance(key, int) else ascii_int(key)
    if pk is not None:
        found = qs.filter(pk=pk).first()
        if found:
            return found
    if isinstance(key, str):
        return qs.filter(slug=slugify(key)).first() or qs.filter(name=key).first()
    return None
