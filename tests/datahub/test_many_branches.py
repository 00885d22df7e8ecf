"""An experiment's repo with a branch for each of many runs (650 made a 612 KB repo page, each
run-<n> on it 11 times): the page names a few in its head and shows a page of the Branches table,
in natural order; the upload form offers no run's branch (an upload there is a 409); the API pages
them with limit and offset."""
from __future__ import annotations

import re

import pytest

from datahub import repos, services
from datahub.models import Branch
from datahub.views import BRANCHES_PER_PAGE, HEAD_BRANCHES
from experiments.services import default_experiment
from tests.conftest import assert_error
from training.models import TrainingRun

RUNS = 120


@pytest.fixture
def experiment_repo(project, users):
    experiment = default_experiment(project)
    repo = services.provision_experiment_repo(experiment)
    runs = TrainingRun.objects.bulk_create([
        TrainingRun(project=project, experiment=experiment, created_by=users["owner"], name=f"r{i}", method="sft", status="completed",
                    base_model="org/base", dataset="org/data", config={}, compute={"backend": "local"}) for i in range(RUNS)])
    head = repos.resolve(repo, "main")
    # a run's branch each, a person's branch, and a run-<n> left by a run since deleted (a person's now)
    Branch.objects.bulk_create([Branch(repo=repo, name=f"run-{run.pk}", head=head) for run in runs]
                               + [Branch(repo=repo, name="dev", head=head), Branch(repo=repo, name="run-999999999", head=head)])
    return repo, [run.pk for run in runs]


def natural(names):
    return sorted(names, key=repos.natural_key)


def test_the_repo_page_shows_a_page_of_branches_in_natural_order_and_offers_no_runs_branch_for_upload(browser, project, experiment_repo):
    repo, run_ids = experiment_repo
    every = natural(["main", "dev", "run-999999999", *(f"run-{pk}" for pk in run_ids)])
    assert every[:2] == ["dev", "main"] and every[-1] == "run-999999999"
    html = browser("member").get(f"/hub/{project.slug}/{repo.name}").content.decode()
    table = re.search(r'<section class="card" id="branches".*?</section>', html, re.S).group(0)
    assert re.findall(r'data-branch="([^"]+)"', table) == every[:BRANCHES_PER_PAGE]
    assert f"Branches 1–{BRANCHES_PER_PAGE} of {len(every)}" in table and "?branches=2#branches" in table
    head = re.search(r'<p id="repo-head".*?</p>', html, re.S).group(0)
    assert re.findall(r"<code>([^<]+)</code></a>", head) == every[:HEAD_BRANCHES] and f"{len(every) - HEAD_BRANCHES} more" in head
    select = re.search(r'<select[^>]*name="branch".*?</select>', html, re.S).group(0)
    assert re.findall(r'<option value="([^"]+)"', select) == ["dev", "main", "run-999999999"]
    last = every[-2]  # a run's branch on the last page: on this page nowhere
    assert last not in html
    page3 = browser("member").get(f"/hub/{project.slug}/{repo.name}", {"branches": "3"}).content.decode()
    table3 = re.search(r'<section class="card" id="branches".*?</section>', page3, re.S).group(0)
    assert re.findall(r'data-branch="([^"]+)"', table3) == every[2 * BRANCHES_PER_PAGE:3 * BRANCHES_PER_PAGE]


def test_branches_api_pages_with_limit_and_offset_in_natural_order(api, experiment_repo):
    repo, run_ids = experiment_repo
    every = natural(["main", "dev", "run-999999999", *(f"run-{pk}" for pk in run_ids)])
    body = api.get(f"/api/hub/repos/{repo.name}/branches", limit=20, offset=40).json()
    assert body["count"] == len(every) and [b["name"] for b in body["items"]] == every[40:60]
    first = api.get(f"/api/hub/repos/{repo.name}/branches").json()
    assert len(first["items"]) == 100 and first["items"][0] == {"name": "dev", "commit": repos.resolve(repo, "main").pk}


@pytest.mark.parametrize("query, field", [({"limit": "0"}, "limit"), ({"limit": "1001"}, "limit"), ({"limit": "x"}, "limit"),
                                          ({"offset": "-1"}, "offset"), ({"offset": str(2**31)}, "offset")])
def test_branches_api_with_a_bad_page_is_400_naming_it(api, experiment_repo, query, field):
    repo, _ = experiment_repo
    assert_error(api.get(f"/api/hub/repos/{repo.name}/branches", **query), 400, field)
