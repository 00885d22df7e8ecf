from django.db import migrations, models
from django.utils import timezone


class Migration(migrations.Migration):
    """joined_at for new memberships only: a row that exists already keeps null (its tokens stay valid),
    so the column is added without a default and the default set after."""

    dependencies = [
        ("studio", "0003_membership_last_used_at"),
    ]

    operations = [
        migrations.AddField(model_name="membership", name="joined_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.AlterField(model_name="membership", name="joined_at", field=models.DateTimeField(blank=True, null=True, default=timezone.now)),
    ]
