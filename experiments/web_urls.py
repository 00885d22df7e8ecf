from __future__ import annotations

from django.urls import path

from experiments import views

app_name = "experiments"
urlpatterns = [
    path("", views.experiment_list, name="list"),
    path("create", views.experiment_create, name="create"),
    path("<int:experiment_id>/", views.experiment_detail, name="detail"),
]
