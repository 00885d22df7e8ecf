"""Template helpers for the Studio pages: the nav's projects, labelled form fields, durations."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.conf import settings
from django.templatetags.static import static
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from studio.auth import current_project_for_session
from studio.parsing import isolated as isolated_text
from studio.queries import membership, projects_for

register = template.Library()


@register.simple_tag(takes_context=True)
def nav_state(context) -> dict[str, Any]:
    """The projects the user can switch between, the current one and the user's role in it."""
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return {"projects": [], "current": None, "role": None}
    current = context.get("project") or current_project_for_session(request)
    member = membership(request.user, current) if current else None
    return {"projects": list(projects_for(request.user).order_by("slug")), "current": current, "role": member.role if member else None}


@register.filter
def isolated(name: object) -> str:
    """A user-given name put into the Studio's own sentence (a confirm dialog): studio.parsing.isolated."""
    return isolated_text(name)


@register.simple_tag
def htmx_scripts() -> SafeString:
    """htmx itself, plus (DEBUG only) js/htmx-debug.js, which shows a 5xx's error page.

    Not django-htmx's {% htmx_script %}: under DEBUG it adds a handler that replaces the whole
    document with any 400/403/404/500 answer, overriding the htmx-config in base.html that swaps
    400/402/409/422 findings into their target. The page must behave the same in development."""
    tags = format_html('<script src="{}" defer></script>', static("django_htmx/htmx-2.min.js"))
    if settings.DEBUG:
        tags += format_html('<script src="{}" defer></script>', static("js/htmx-debug.js"))
    return tags


@register.filter
def get(mapping: Any, key: str) -> Any:
    if isinstance(mapping, dict):
        return mapping.get(key)
    return None


def _seconds(value: Any) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)):
        return float(value)
    return None


@register.filter
def duration(value: Any) -> str:
    """Seconds or a timedelta as 1h 02m / 3m 05s / 42s."""
    seconds = _seconds(value)
    if seconds is None:
        return "—"
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def run_span(run) -> tuple[datetime | None, datetime | None]:
    """When the run's Duration counts from and to (None: not started; to None: still going). started_at
    is when its engine started the run's work (status running), so model loading and a slow first step
    count. A run that failed or was cancelled before it ran (no started_at: it waited for a machine or a
    slot) counts from when its worker claimed it (provisioning_since), so it shows the time it took to end."""
    start: datetime | None = run.started_at
    if start is None and run.finished_at is not None and run.provisioning_since is not None and run.provisioning_since <= run.finished_at:
        start = run.provisioning_since
    return start, run.finished_at


@register.filter
def run_duration(run) -> str:
    """How long the run has been (or was) going: run_span's start → its end, or → now while active."""
    start, end = run_span(run)
    if start is None:
        return "—"
    return duration((end or timezone.now()) - start)


@register.filter
def ticking_since(run) -> datetime | None:
    """The start (to the second) of a run whose Duration still grows, which the browser counts up from
    (static/js/studio.js); None once it is fixed. The polled status area shows this rather than the
    duration itself: an answer that differs every second is swapped in on every poll, moving focus
    and making screen readers read the area again although nothing happened."""
    start, end = run_span(run)
    return start.replace(microsecond=0) if start is not None and end is None else None


@register.filter
def progress_pct(run) -> int | None:
    progress = run.progress or {}
    step, total = progress.get("step"), progress.get("max_steps")
    if run.status == "completed":
        return 100
    if isinstance(step, (int, float)) and isinstance(total, (int, float)) and total > 0:
        return int(min(100, max(0, 100 * step / total)))
    return None


@register.simple_tag
def field_errors(errors: dict, field: str):
    """The findings for one field, as an inline list tied to the field by id (aria-describedby)."""
    messages = (errors or {}).get(field) or []
    if not messages:
        return ""
    items = format_html("".join("<li>{}</li>" for _ in messages), *messages)
    return format_html('<ul class="field-errors" id="{}-errors" role="alert">{}</ul>', dom_id(field), items)


@register.filter
def dom_id(field: str) -> str:
    return "f-" + "".join(c if c.isalnum() else "-" for c in field)


@register.inclusion_tag("ui/field.html")
def field(form, name: str, label: str, kind: str = "text", help: str = "", choices: Any = None, **attrs: Any) -> dict:
    """One labelled input (text, number, select, checkbox, textarea) with its findings beside it."""
    values, errors = form.get("values", {}), form.get("errors", {})
    value = values.get(name)
    if kind == "checkbox":
        value = bool(value)
    options = []
    for choice in choices or []:
        key, text = (choice, choice) if isinstance(choice, str) else choice
        options.append({"value": key, "label": text, "selected": str(value if value is not None else "") == str(key)})
    return {
        "name": name, "label": label, "kind": kind, "help": help, "value": "" if value is None else value,
        "errors": errors.get(name) or [], "id": dom_id(name), "options": options, "attrs": attrs,
    }


@register.filter
def attrs_html(attrs: dict) -> str:
    parts = []
    for key, value in (attrs or {}).items():
        name = key.replace("_", "-")
        if value is True:
            parts.append(format_html("{}", name))
        elif value not in (None, False):
            parts.append(format_html('{}="{}"', name, value))
    return format_html(" ".join(["{}"] * len(parts)), *parts) if parts else ""


@register.filter
def binary_h(value: Any) -> str:
    """Bytes in the binary units GPU memory is quoted in (GiB), small ones in MiB or KiB: a tiny
    teacher read "≈ 0.0 GiB" beside a card's "80 GiB"."""
    try:
        size = float(value)
    except (TypeError, ValueError):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


@register.filter
def bytes_h(value: Any) -> str:
    try:
        size = float(value)
    except (TypeError, ValueError):
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


@register.filter
def params_h(value: Any) -> str:
    try:
        n = float(value)
    except (TypeError, ValueError):
        return "—"
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n:.0f}"


@register.filter
def pretty(value: Any) -> str:
    """A config value as it would be written in YAML/JSON."""
    import json

    if isinstance(value, str):
        return value
    return json.dumps(value)


@register.simple_tag
def hub_url(ref: Any, project_slug: str) -> str:
    """The Hub browser's page for a Data Hub ref `[project/]repo@ref`, or "" for anything else."""
    from django.urls import NoReverseMatch, reverse

    from training.refs import HUB_REF

    match = HUB_REF.match(ref) if isinstance(ref, str) else None
    if not match:
        return ""
    try:
        return reverse("datahub:tree", args=[match["project"] or project_slug, match["repo"], match["ref"]])
    except NoReverseMatch:
        return ""
