from django.db import migrations

TERMINAL = ("completed", "failed", "cancelled")


def drop_eta(apps, schema_editor):
    """A run that ended has nothing left to wait for: its progress keeps no ETA (status.transition
    drops it when a run ends; runs that ended before kept their last step's)."""
    TrainingRun = apps.get_model("training", "TrainingRun")
    for run_id, progress in TrainingRun.objects.filter(status__in=TERMINAL, progress__has_key="eta_s").values_list("pk", "progress").iterator():
        TrainingRun.objects.filter(pk=run_id).update(progress={k: v for k, v in progress.items() if k != "eta_s"})


class Migration(migrations.Migration):

    dependencies = [
        ('training', '0013_attempt_started_at'),
    ]

    operations = [
        migrations.RunPython(drop_eta, migrations.RunPython.noop),
    ]
