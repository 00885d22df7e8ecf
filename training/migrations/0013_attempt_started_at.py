from django.db import migrations, models


def backfill_started_at(apps, schema_editor):
    """A run's started_at is the start of the first attempt of its last START (start_attempt: attempt
    minus the interruptions retried since); earlier attempts' starts were not kept and stay null."""
    TrainingRun = apps.get_model("training", "TrainingRun")
    RunAttempt = apps.get_model("training", "RunAttempt")
    for run_id, attempt, interruptions, started_at in TrainingRun.objects.filter(started_at__isnull=False).values_list(
            "pk", "attempt", "interruptions", "started_at").iterator():
        RunAttempt.objects.filter(run_id=run_id, attempt=max(attempt - interruptions, 0)).update(started_at=started_at)


class Migration(migrations.Migration):
    """RunAttempt.started_at was when a worker claimed the attempt, while the run's started_at is when
    it went running: the API gave two starts for one attempt. The claim is now claimed_at, and
    started_at is when the attempt went running, as the run's is."""

    dependencies = [
        ('training', '0012_metric_series_index'),
    ]

    operations = [
        migrations.RenameField(model_name='runattempt', old_name='started_at', new_name='claimed_at'),
        migrations.AddField(model_name='runattempt', name='started_at', field=models.DateTimeField(blank=True, null=True)),
        migrations.RunPython(backfill_started_at, migrations.RunPython.noop),
    ]
