"""NEW RUN's suggestions in the model and dataset fields (<datalist>s): the demo bootstrapdemo built,
the current project's Data Hub repos as refs, its recent runs' base models; never another project's."""
from __future__ import annotations

import html as htmllib
import io
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from datahub.repos import create_repo
from studio.services import add_member
from training import services
from training.models import TrainingRun
from training.suggestions import RECENT_LIMIT, REPO_LIMIT, demo_marker

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def options(page: str, datalist: str) -> list[str]:
    """The values a datalist offers, in order (an absent datalist offers none)."""
    found = re.search(rf'<datalist id="{datalist}"[^>]*>(.*?)</datalist>', page, re.S)
    return [htmllib.unescape(v) for v in re.findall(r'<option value="([^"]*)"', found.group(1))] if found else []


def help_of(page: str, field_id: str) -> str:
    found = re.search(rf'<p class="help" id="{field_id}-help">(.*?)</p>', page, re.S)
    return htmllib.unescape(found.group(1)) if found else ""


def make_run(project, user, name: str, base_model: str):
    return services.create_run(project, user, name=name, method="sft", base_model=base_model, dataset="my-data@main", config={"lora_rank": 16})


@pytest.fixture
def no_demo(settings, tmp_path):
    settings.VAR_DIR = tmp_path  # bootstrapdemo never ran here


def test_after_bootstrapdemo_new_run_suggests_the_demo_model_and_the_methods_demo_datasets(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEBUG = True  # as make studio runs it
    call_command("bootstrapdemo", stdout=io.StringIO())  # the real one: builds the tiny models with the engine
    built = json.loads(demo_marker().read_text())
    client = client_for(get_user_model().objects.get(is_superuser=True))
    page = client.get("/training/new/").content.decode()
    # The demo's files, then its Data Hub repos (bootstrapdemo commits them too), each dataset for its method.
    assert options(page, "model-choices") == [built["student"], built["teacher"], "demo-student@main", "demo-teacher@main"]
    assert options(page, "dataset-choices") == [built["sft"], built["sft_text"], built["sft_prompt_completion"],
                                                "demo-sft@main", "demo-sft-prompt-completion@main", "demo-sft-text@main"]
    assert 'list="model-choices"' in page.split('id="f-base-model"')[1].split(">")[0]
    assert 'list="dataset-choices"' in page.split('id="f-dataset"')[1].split(">")[0]
    model_help = help_of(page, "f-base-model")
    assert "HF id" in model_help and "my-model@main" in model_help and built["student"] in model_help
    assert built["sft"] in help_of(page, "f-dataset")
    # The help's local example is this method's demo dataset: DPO's is its preference pairs, not SFT's chats.
    dpo_page = client.get("/training/new/", {"method": "dpo"}).content.decode()
    assert built["dpo"] in help_of(dpo_page, "f-dataset") and built["sft"] not in help_of(dpo_page, "f-dataset")

    # The picker swaps the method card, and the datalist with it: DPO's demo rows are preference pairs.
    # The dataset's help is outside the card: it comes along out of band.
    dpo = client.get("/training/new/method", {"method": "dpo"}, HTTP_HX_REQUEST="true").content.decode()
    assert options(dpo, "dataset-choices") == [built["dpo"], "demo-dpo@main"]
    oob = re.search(r'<p class="help" id="f-dataset-help" hx-swap-oob="true">(.*?)</p>', dpo, re.S)
    assert oob and built["dpo"] in htmllib.unescape(oob.group(1)), dpo[:3000]
    assert 'hx-swap-oob' not in page  # the whole page has the help once, in its place
    distill = client.get("/training/new/method", {"method": "distill"}, HTTP_HX_REQUEST="true").content.decode()
    assert options(distill, "dataset-choices") == [built["distill"], "demo-distill@main"]
    assert 'list="model-choices"' in distill.split('id="f-config-distillation-teacher-model"')[1].split(">")[0]

    # What is suggested is what START accepts on the local backend.
    response = client.post("/training/new/", {"name": "demo sft", "method": "sft", "base_model": built["student"], "dataset": built["sft"],
                                               "compute.backend": "local", "compute.accelerators": "CPU", "config_text": "lora_rank: 4\n"})
    assert response.status_code == 302, response.content.decode()[:2000]
    run = TrainingRun.objects.get(name="demo sft")
    assert run.base_model == built["student"]
    assert not [f for f in services.start_blockers(run) if f.field in ("base_model", "dataset")]

    # Folders runs may not read (outside STUDIO_LOCAL_ROOTS) are not suggested: START would refuse them.
    settings.STUDIO_LOCAL_ROOTS = [(tmp_path / "elsewhere").resolve()]
    page = client.get("/training/new/").content.decode()
    assert options(page, "model-choices") == ["demo-student@main", "demo-teacher@main", built["student"]]  # the path as the run's base model now
    assert "(bootstrapdemo)" not in page
    assert options(page, "dataset-choices") == ["demo-sft@main", "demo-sft-prompt-completion@main", "demo-sft-text@main"]
    assert "/data/models/my-model" in help_of(page, "f-base-model")


def test_new_run_suggests_only_the_current_projects_repos_and_base_models(project, other_project, users, no_demo):
    owner = users["owner"]
    add_member(other_project, owner, "member")  # the owner can see globex too: still none of it on acme's form
    create_repo(project, "acme-model", "model", owner)
    create_repo(project, "acme-data", "dataset", owner)
    create_repo(project, "acme-env", "environment", owner)
    make_run(project, owner, "acme run", "org/acme-base")
    create_repo(other_project, "globex-model", "model", users["outsider"])
    create_repo(other_project, "globex-data", "dataset", users["outsider"])
    make_run(other_project, users["outsider"], "globex run", "org/globex-base")

    client = client_for(owner)
    page = client.get("/training/new/").content.decode()
    assert options(page, "model-choices") == ["acme-model@main", "org/acme-base"]
    assert options(page, "dataset-choices") == ["acme-data@main"]
    assert "globex-model" not in page and "globex-data" not in page and "org/globex-base" not in page
    assert "bootstrapdemo" not in page  # no demo was built
    dpo = client.get("/training/new/method", {"method": "dpo"}, HTTP_HX_REQUEST="true").content.decode()
    assert options(dpo, "dataset-choices") == ["acme-data@main"] and "globex" not in dpo

    assert client.post("/projects/switch", {"project": "globex", "next": "/training/new/"}).status_code == 302
    page = client.get("/training/new/").content.decode()
    assert options(page, "model-choices") == ["globex-model@main", "org/globex-base"]
    assert options(page, "dataset-choices") == ["globex-data@main"]
    assert "acme-model" not in page and "acme-data" not in page and "org/acme-base" not in page


def test_new_run_suggestions_are_bounded_and_take_a_fixed_number_of_queries(project, users, no_demo, django_assert_max_num_queries):
    owner = users["owner"]
    create_repo(project, "model-0", "model", owner)
    make_run(project, owner, "run 0", "org/base-0")
    client = client_for(owner)
    client.get("/training/new/")
    with django_assert_max_num_queries(20) as few:
        client.get("/training/new/")
    for i in range(1, REPO_LIMIT + 10):
        create_repo(project, f"model-{i}", "model", owner)
        create_repo(project, f"data-{i}", "dataset", owner)
    for i in range(1, RECENT_LIMIT + 5):
        make_run(project, owner, f"run {i}", f"org/base-{i}")
    make_run(project, owner, "run again", "org/base-0")  # used again: the most recent, listed once
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = client.get("/training/new/").content.decode()
    models = options(page, "model-choices")
    repos = [m for m in models if m.endswith("@main")]
    recent = [m for m in models if m.startswith("org/")]
    assert len(repos) == REPO_LIMIT and "model-0@main" not in repos and f"model-{REPO_LIMIT + 9}@main" in repos  # the newest
    assert recent[:2] == ["org/base-0", f"org/base-{RECENT_LIMIT + 4}"] and len(recent) == RECENT_LIMIT
    assert len(options(page, "dataset-choices")) == REPO_LIMIT
