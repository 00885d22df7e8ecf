"""Tenancy: plans, projects, members, API tokens and the per-project secret store."""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone


class Plan(models.Model):
    """What a project may do. Edited in the Django admin (the "admin console for plans")."""

    name = models.CharField(max_length=64, unique=True)
    includes_training = models.BooleanField(default=True)
    max_concurrent_runs = models.PositiveIntegerField(default=2, help_text="Runs provisioning or running at once.")
    max_gpus_per_run = models.PositiveIntegerField(default=8)

    def __str__(self) -> str:
        return self.name


# A project's Data Hub pages are /hub/<slug>/<repo> (datahub.hf_urls), beside routes whose first
# segment is a word of their own: /hub/api/… (the Hub read API), /hub/datasets/<ns>/<repo>/resolve/…
# and /hub/new. A project of such a slug would have pages no URL reaches.
RESERVED_PROJECT_SLUGS = frozenset({"api", "datasets", "new"})


def validate_unreserved_slug(slug: str) -> None:
    """The model's own check, so the admin (and any ModelForm) refuses what create_project refuses."""
    if slug in RESERVED_PROJECT_SLUGS:
        raise ValidationError(f"{slug!r} cannot be a project slug: /hub/{slug}/ is one of the Studio's own URLs. "
                              f"Choose another slug, e.g. {slug}-team; {', '.join(sorted(RESERVED_PROJECT_SLUGS))} "
                              f"are kept for the Studio's URLs.")


class Project(models.Model):
    slug = models.SlugField(max_length=64, unique=True, validators=[validate_unreserved_slug])
    name = models.CharField(max_length=200, blank=True)
    plan = models.ForeignKey(Plan, null=True, blank=True, on_delete=models.PROTECT, related_name="projects")
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="projects")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    OWNER = "owner"
    MEMBER = "member"
    VIEWER = "viewer"


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    # When the user last switched to this project: a new session (after logging in) opens there.
    last_used_at = models.DateTimeField(null=True, blank=True)
    # When this membership began. A token its user made before then belongs to an earlier membership,
    # however that one ended (the service, the admin, a shell or SQL), and does not come back with this
    # one. Null for memberships older than the column: their tokens are judged by revocation alone.
    joined_at = models.DateTimeField(null=True, blank=True, default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="one_membership_per_user")]

    @property
    def can_write(self) -> bool:
        return self.role in (Role.OWNER, Role.MEMBER)


class ApiToken(models.Model):
    """A bearer token scoped to one project. Only its SHA-256 is stored; the token is shown once."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to tell tokens apart.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user} @ {self.project})"


class ProjectSecret(models.Model):
    """A named secret (judge API key, backend token), encrypted at rest; never returned once saved."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=100)
    ciphertext = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="one_secret_per_name")]

    def __str__(self) -> str:
        return f"{self.project}/{self.name}"


class AuditEvent(models.Model):
    """Who did what to which row, and when. Written by the services (studio/audit.py), never edited.

    The actor and project are kept as text too, so the trail survives the user or project."""

    class Action(models.TextChoices):
        CREATED = "created"
        STARTED = "started"
        STOPPED = "stopped"
        PATCHED = "patched"
        DELETED = "deleted"
        UPDATED = "updated"  # a secret's value replaced
        ADDED = "added"  # a member
        REMOVED = "removed"
        ROLE_CHANGED = "role_changed"
        REVOKED = "revoked"  # an API token
        UPLOADED = "uploaded"  # files committed to a Data Hub branch
        FILES_DELETED = "files_deleted"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_name = models.CharField(max_length=150, blank=True)
    via = models.CharField(max_length=32, blank=True, help_text="session, token <prefix>…, or system")
    ip = models.GenericIPAddressField(null=True, blank=True)
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_events")
    project_slug = models.CharField(max_length=64, blank=True)
    action = models.CharField(max_length=16, choices=Action.choices)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    target_name = models.CharField(max_length=200, blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "-created_at"]), models.Index(fields=["target_type", "target_id"])]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name or 'system'} {self.action} {self.target_type} {self.target_id}"


class WebhookEvent(models.TextChoices):
    """What a webhook can be sent: the end of a run, one event per terminal status; the publish of a
    run's weights to its model repo, which comes after run.completed (PING is the Send test button's,
    never subscribed to)."""

    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    MODEL_PUBLISHED = "model.published"
    PING = "ping"


SUBSCRIBABLE_EVENTS = (WebhookEvent.RUN_COMPLETED, WebhookEvent.RUN_FAILED, WebhookEvent.RUN_CANCELLED, WebhookEvent.MODEL_PUBLISHED)


def all_run_events() -> list[str]:
    return [str(event) for event in SUBSCRIBABLE_EVENTS]


class Webhook(models.Model):
    """A URL told when a project's runs end and their models are published. Its signing secret is
    encrypted at rest and shown once, when the Studio makes it (studio/webhooks.py)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    events = models.JSONField(default=all_run_events, help_text="The events it is sent (SUBSCRIBABLE_EVENTS).")
    secret_ciphertext = models.BinaryField()
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.project}: {self.url}"


class WebhookDelivery(models.Model):
    """One event sent (or being sent) to one webhook, with how its last try went. The newest
    DELIVERIES_KEPT per webhook are kept."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32, choices=WebhookEvent.choices)
    run_id = models.IntegerField(null=True, blank=True)
    payload = models.JSONField()
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    tries = models.JSONField(default=list, blank=True, help_text="[{at, status_code, error}] of each try.")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    next_try_at = models.DateTimeField(null=True, blank=True, help_text="When the next try is due; null once delivered or given up.")
    claimed_until = models.DateTimeField(
        null=True, blank=True, help_text="A try is being sent until then (the worker's lease, studio.webhooks.claim_try); null when none is."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["webhook", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.event} → {self.webhook_id} ({self.attempts} tries)"
