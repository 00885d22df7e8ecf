"""Verify a backend connection with one real call (from a Celery task), and keep the answer on the
connection so START can report it without calling the backend from the web request."""
from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from studio.queue import send_after_commit
from training.backends.base import BackendError
from training.models import BackendConnection


def verify_connection(connection_id: int) -> str:
    """Returns "" when the connection works, else the reason (also saved as last_check_error)."""
    from training.backends import get_backend

    conn = BackendConnection.objects.select_related("project").get(pk=connection_id)
    backend = get_backend(conn.backend)
    error = ""
    try:
        backend.verify(conn)
    except BackendError as exc:
        error = str(exc)
    BackendConnection.objects.filter(pk=conn.pk).update(last_checked_at=timezone.now(), last_check_error=error[:2000])
    return error


def recheck_connections_naming(project, secret_name: str) -> None:
    """Queue a check, after commit, of each of the project's connections that names the secret: the
    last check's answer (shown in the admin and at START) was about the old value or its absence."""
    from training.tasks import verify_backend_connection

    named = BackendConnection.objects.filter(project=project).filter(Q(token_secret=secret_name) | Q(token_id_secret=secret_name))
    for connection_id in named.values_list("pk", flat=True):
        send_after_commit(verify_backend_connection, connection_id)
