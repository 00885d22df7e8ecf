from django.db import migrations, models
import django.db.models.deletion


# Apart from 0005: on PostgreSQL an ALTER TABLE cannot follow 0005's UPDATE in one transaction
# (the UPDATE leaves deferred foreign-key checks pending).
class Migration(migrations.Migration):

    dependencies = [
        ('datahub', '0005_upload_session_project_repo_name'),
    ]

    operations = [
        migrations.AlterField(
            model_name='uploadsession',
            name='project',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='studio.project'),
        ),
        migrations.AlterField(
            model_name='uploadsession',
            name='repo',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='uploads', to='datahub.repo'),
        ),
        migrations.AlterField(
            model_name='uploadsession',
            name='abort_reason',
            field=models.CharField(blank=True, help_text='Why the Studio aborted it (hub_gc, a deleted repo), e.g. "it had no activity for 7 days"; blank when its client did.', max_length=200),
        ),
    ]
