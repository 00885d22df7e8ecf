import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('training', '0007_checkpoint_commit'),
    ]

    operations = [
        migrations.CreateModel(
            name='RunAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('attempt', models.PositiveIntegerField()),
                ('base_model', models.CharField(blank=True, max_length=500)),
                ('dataset', models.JSONField(blank=True, null=True)),
                ('config', models.JSONField(blank=True, default=dict)),
                ('compute', models.JSONField(blank=True, default=dict)),
                ('pinned', models.JSONField(blank=True, default=dict)),
                ('started_at', models.DateTimeField(auto_now_add=True)),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='training.trainingrun')),
            ],
            options={
                'ordering': ['attempt'],
                'constraints': [models.UniqueConstraint(fields=('run', 'attempt'), name='one_record_per_attempt')],
            },
        ),
    ]
