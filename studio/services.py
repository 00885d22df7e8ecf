"""The only functions that create or change plans, projects, members, tokens and secrets."""
from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from studio import audit, crypto
from studio.errors import BadRequest, Finding, NotFound
from studio.models import RESERVED_PROJECT_SLUGS, ApiToken, AuditEvent, Membership, Plan, Project, ProjectSecret, Role

TOKEN_PREFIX = "stu"
# \Z, not $: $ also matches before a trailing newline, and "KEY\n" was stored as a secret name.
SECRET_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}\Z")


PLAN_LIMITS = ("includes_training", "max_concurrent_runs", "max_gpus_per_run")


@transaction.atomic
def create_plan(name: str, *, includes_training: bool = True, max_concurrent_runs: int = 2, max_gpus_per_run: int = 8) -> Plan:
    """Create plan `name`, or give it these limits; either is in the audit trail (the fields that
    changed, from and to, as the admin's edits), a plan left as it was is not."""
    before = Plan.objects.select_for_update().filter(name=name).values(*PLAN_LIMITS).first()
    limits = {"includes_training": includes_training, "max_concurrent_runs": max_concurrent_runs, "max_gpus_per_run": max_gpus_per_run}
    plan, _ = Plan.objects.update_or_create(name=name, defaults=limits)
    changes = {key: {"from": (before or {}).get(key), "to": value} for key, value in limits.items() if before is None or before[key] != value}
    if changes:
        audit.record(AuditEvent.Action.UPDATED if before else AuditEvent.Action.CREATED, plan, name=plan.name, details={"changes": changes})
    return plan


PROJECT_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}\Z")


@transaction.atomic
def create_project(slug: str, *, owner, plan: Plan | None = None, name: str = "") -> Project:
    if not PROJECT_SLUG.match(slug or ""):
        raise BadRequest(f"{slug!r} is not a project slug.", [Finding("slug", "a slug has 1 to 64 lower-case letters, digits and dashes, starting with a letter or digit")])
    if slug in RESERVED_PROJECT_SLUGS:
        raise BadRequest(f"{slug!r} cannot be a project slug: /hub/{slug}/ is one of the Studio's own URLs, so the project's "
                         f"Data Hub pages (/hub/{slug}/<repo>) could not be reached.",
                         [Finding("slug", f"choose another slug, e.g. {slug}-team; {', '.join(sorted(RESERVED_PROJECT_SLUGS))} are kept for the Studio's URLs")])
    project = Project.objects.create(slug=slug, name=name or slug, plan=plan)
    Membership.objects.create(project=project, user=owner, role=Role.OWNER)
    return project


@transaction.atomic
def set_plan(project: Project, plan: Plan | None) -> Project:
    """Put `project` on `plan` (None: no plan), in the audit trail when that changes its plan."""
    before = Project.objects.select_for_update().get(pk=project.pk).plan
    project.plan = plan
    project.save(update_fields=["plan"])
    if before != plan:
        audit.record(AuditEvent.Action.UPDATED, project, project=project, name=project.slug,
                     details={"changes": {"plan": {"from": before.name if before else None, "to": plan.name if plan else None}}})
    return project


@transaction.atomic
def add_member(project: Project, user, role: str) -> Membership:
    """Make `user` a member of `project` with `role`, or give a member that role."""
    if role not in Role.values:
        raise BadRequest(errors=[Finding("role", f"role must be one of {', '.join(Role.values)}")])
    before = Membership.objects.select_for_update().filter(project=project, user=user).values_list("role", flat=True).first()
    member, joined = Membership.objects.update_or_create(project=project, user=user, defaults={"role": role})
    if joined:  # tokens left from an earlier membership, however it ended, are shown revoked
        revoke_member_tokens(project, user)
        audit.record(AuditEvent.Action.ADDED, member, project=project, name=user.get_username(), details={"role": role})
    elif before != role:
        audit.record(AuditEvent.Action.ROLE_CHANGED, member, project=project, name=user.get_username(), details={"role": role, "previous_role": before})
    return member


@transaction.atomic
def remove_member(project: Project, user) -> None:
    """Take `user` out of `project` and revoke every token they hold for it. authenticate_token
    refuses a token while its user is no member; without the revocation, adding them back (a
    re-invite) would bring back every token they ever had there."""
    member = Membership.objects.select_for_update().filter(project=project, user=user).first()
    if member is not None:
        member.delete()
    revoked = revoke_member_tokens(project, user)
    if member is not None:
        audit.record(AuditEvent.Action.REMOVED, member, project=project, name=user.get_username(), details={"role": member.role, "tokens_revoked": revoked})


def revoke_member_tokens(project: Project, user) -> int:
    """Revoke `user`'s live tokens for `project` (they left it, or their membership row was given to
    someone else); returns how many."""
    return ApiToken.objects.filter(project=project, user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())


def remember_project(user, project: Project) -> None:
    """The project `user` chose last: the one a new session of theirs opens in."""
    Membership.objects.filter(user=user, project=project).update(last_used_at=timezone.now())


@transaction.atomic
def create_api_token(user, project: Project, *, name: str = "") -> tuple[ApiToken, str]:
    """Make a token for `user` in `project`; returns the row and the plaintext (shown once; the
    audit trail keeps its prefix, as the admin shows it)."""
    if not Membership.objects.filter(project=project, user=user).exists():
        raise BadRequest(errors=[Finding("user", f"{user} is not a member of project {project.slug}")])
    limit = ApiToken._meta.get_field("name").max_length
    if len(name) > limit:
        raise BadRequest(errors=[Finding("name", f"a token's name has at most {limit} characters; this one has {len(name)}")])
    if "\x00" in name:  # PostgreSQL cannot store it: a 500 otherwise
        raise BadRequest(errors=[Finding("name", "a token's name cannot contain a NUL character (\\u0000): remove it")])
    plaintext = crypto.new_token(TOKEN_PREFIX)
    token = ApiToken.objects.create(
        project=project, user=user, name=name, prefix=plaintext[:10], token_hash=crypto.hash_token(plaintext)
    )
    audit.record(AuditEvent.Action.CREATED, token, details={"user": user.get_username(), "prefix": token.prefix})
    return token, plaintext


def authenticate_token(plaintext: str) -> ApiToken | None:
    """The live token for this plaintext, if its user is still a member of its project, in the
    membership the token was made in."""
    token = (
        ApiToken.objects.select_related("project", "project__plan", "user")
        .filter(token_hash=crypto.hash_token(plaintext), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    membership = Membership.objects.filter(project=token.project, user=token.user).first() if token else None
    if token is None or membership is None or (membership.joined_at and token.created_at < membership.joined_at):
        return None
    # Only write when it moved a minute: a busy client must not turn every read into a write.
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


@transaction.atomic
def revoke_api_token(token: ApiToken) -> bool:
    """Revoke `token`; False if it already was."""
    if not ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()):
        return False
    audit.record(AuditEvent.Action.REVOKED, token, project=token.project, details={"user": token.user.get_username(), "prefix": token.prefix})
    return True


SECRET_VALUE_MAX = 65_536


@transaction.atomic
def set_secret(project: Project, name: str, value: str) -> ProjectSecret:
    """Store `value` under `name`, replacing any earlier value. The audit trail says which; it
    never holds the value."""
    if not SECRET_NAME.match(name or ""):
        raise BadRequest(errors=[Finding("name", "a secret name starts with a letter and has letters, digits, _ . - (max 100)")])
    if not isinstance(value, str) or value == "":
        raise BadRequest(errors=[Finding("value", "give the secret's value as a non-empty string")])
    if len(value) > SECRET_VALUE_MAX:
        raise BadRequest(errors=[Finding("value", f"a secret's value has at most {SECRET_VALUE_MAX} characters (API keys and tokens are far shorter); this one has {len(value)}")])
    secret, created = ProjectSecret.objects.update_or_create(
        project=project, name=name, defaults={"ciphertext": crypto.encrypt(value)}
    )
    audit.record(AuditEvent.Action.CREATED if created else AuditEvent.Action.UPDATED, secret, project=project)
    _recheck_connections_naming(project, name)
    return secret


def delete_secret(project: Project, name: str) -> None:
    # A name set_secret would refuse cannot exist; PostgreSQL would refuse to compare one with a NUL.
    secret = ProjectSecret.objects.filter(project=project, name=name).first() if SECRET_NAME.match(name or "") else None
    if secret is None:
        raise NotFound(f"No secret named {name!r} in this project.")
    audit.record(AuditEvent.Action.DELETED, secret, project=project)
    secret.delete()
    _recheck_connections_naming(project, name)


def _recheck_connections_naming(project: Project, name: str) -> None:
    # A backend connection's last check complained about this secret (or passed with its old value).
    # Imported here: training builds on studio, not the other way round.
    from training.backends.verify import recheck_connections_naming

    recheck_connections_naming(project, name)


def secret_exists(project: Project, name: str) -> bool:
    return bool(SECRET_NAME.match(name or "")) and ProjectSecret.objects.filter(project=project, name=name).exists()


def reveal_secret(project: Project, name: str) -> str:
    """The plaintext, for handing to a backend or a judge at dispatch time. Never log or return it.

    crypto.UndecryptableSecret, naming the secret to set again, when STUDIO_ENCRYPTION_KEY changed
    since it was saved."""
    secret = ProjectSecret.objects.filter(project=project, name=name).first() if SECRET_NAME.match(name or "") else None
    if secret is None:
        raise NotFound(f"No secret named {name!r} in this project.")
    try:
        return crypto.decrypt(secret.ciphertext)
    except crypto.UndecryptableSecret as exc:
        raise crypto.UndecryptableSecret(
            f"the project secret {name!r} cannot be decrypted: STUDIO_ENCRYPTION_KEY changed since it was saved; "
            f"set it again (Settings → Secrets, or PUT /api/secrets/{name}), or put the old key back"
        ) from exc


def get_user(username: str):
    User = get_user_model()
    try:
        return User.objects.get(username=username)
    except User.DoesNotExist as exc:
        raise NotFound(f"No user named {username!r}: create it first (manage.py createuser {username}).") from exc
