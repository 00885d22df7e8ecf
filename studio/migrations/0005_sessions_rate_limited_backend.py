from django.db import migrations

OLD = "django.contrib.auth.backends.ModelBackend"
NEW = "studio.auth.RateLimitedModelBackend"


def sessions_name_the_rate_limited_backend(apps, schema_editor):
    """Sessions logged in before studio.auth's backend name Django's ModelBackend, which is no longer in
    AUTHENTICATION_BACKENDS: Django would log every such user out at the upgrade. Renamed here; a
    session this SECRET_KEY cannot read (decode gives {}) is left as it is and ends as it would have."""
    from django.contrib.sessions.backends.db import SessionStore

    Session = apps.get_model("sessions", "Session")
    store = SessionStore()
    for session in Session.objects.filter(session_data__isnull=False).iterator():
        data = store.decode(session.session_data)
        if data.get("_auth_user_backend") == OLD:
            data["_auth_user_backend"] = NEW
            Session.objects.filter(pk=session.pk).update(session_data=store.encode(data))


class Migration(migrations.Migration):
    dependencies = [
        ("studio", "0004_membership_joined_at"),
        ("sessions", "0001_initial"),
    ]

    operations = [migrations.RunPython(sessions_name_the_rate_limited_backend, migrations.RunPython.noop)]
