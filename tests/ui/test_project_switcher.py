"""The header's project switcher (POST /projects/switch): it lands on the page it was sent from,
unless that page shows one object of the project just left (a run, an experiment, a Data Hub or
environment repo), which the new project does not have: then on that section's list page."""
from __future__ import annotations

import pytest

from datahub import commits, repos
from studio.services import add_member
from tests.ui.test_pages import client_for, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner_of_both(project, other_project, users):
    add_member(other_project, users["owner"], "member")
    return client_for(users["owner"])


def switch(client, next_url: str) -> str:
    response = client.post("/projects/switch", {"project": "globex", "next": next_url})
    assert response.status_code == 302
    return response["Location"]


def test_from_a_page_of_one_object_it_lands_on_the_section_list_of_the_new_project(project, users, owner_of_both):
    run = make_run(project, users["owner"], "sft")
    data = repos.create_repo(project, "my-data", "dataset")
    commits.commit_files(data, "main", {"train.jsonl": b"{}\n"}, "data")
    repos.create_repo(project, "my-env", "environment")
    pages = {
        "/environments/my-env/": "/environments/",
        "/environments/my-env/config": "/environments/",
        f"/training/runs/{run.pk}/": "/training/",
        f"/training/runs/{run.pk}/lineage/": "/training/",
        f"/training/runs/{run.pk}/edit/": "/training/",
        f"/experiments/{run.experiment_id}/": "/experiments/",
        "/hub/acme/my-data": "/hub/",
        "/hub/acme/my-data/tree/main/": "/hub/",
        "/hub/acme/my-data/commits/main": "/hub/",
    }
    for page, landing in pages.items():
        assert switch(owner_of_both, page) == landing, page
        response = owner_of_both.get(landing)
        assert response.status_code == 200 and "globex" in response.content.decode(), page


def test_from_a_list_or_project_wide_page_it_stays_there(project, owner_of_both):
    for page in ("/training/?status=running", "/training/new/?method=grpo", "/experiments/", "/hub/", "/environments/",
                 "/models/", "/settings/secrets/", "/settings/billing/", "/settings/api-tokens/"):
        assert switch(owner_of_both, page) == page
        assert owner_of_both.get(page).status_code == 200, page


def test_a_next_that_is_not_a_page_here_lands_home(project, owner_of_both):
    for page in ("https://evil.example/", "//evil.example/x", "/no/such/page/", ""):
        assert switch(owner_of_both, page) == "/", page
