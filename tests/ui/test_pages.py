"""Server-side checks of the Studio pages with Django's test client (fast; no browser)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import refused_form_page
from training import services
from training.models import Checkpoint, MetricPoint, Rollout, Status, TrainingRun

pytestmark = pytest.mark.django_db

METHOD_BODIES = {
    "sft": {"config": {"lora_rank": 16}},
    "dpo": {"config": {"lora_rank": 16, "loss": {"type": "dpo"}}},
    "grpo": {"config": {"rl_mode": "environment", "environment_id": "builtin/arith@main"}, "dataset": None},
    "distill": {"config": {"distillation": {"teacher_model": "org/teacher-8B"}}},
}
EXPECTED_TABS = {
    "sft": ["overview", "configuration", "datasets", "checkpoints", "lineage", "repository"],
    "dpo": ["overview", "configuration", "datasets", "checkpoints", "lineage", "repository"],
    "distill": ["overview", "configuration", "datasets", "checkpoints", "lineage", "repository"],
    # A GRPO run without a dataset (its prompts come from the environment) has no Datasets tab.
    "grpo": ["overview", "configuration", "environment", "rollouts", "checkpoints", "lineage", "repository"],
}
ALL_TABS = {"overview", "configuration", "datasets", "checkpoints", "lineage", "environment", "rollouts", "repository"}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_run(project, user, method, **overrides):
    body = {"name": f"{method} run", "method": method, "base_model": "org/base", "dataset": "my-data@main", **METHOD_BODIES[method]}
    body.update(overrides)
    return services.create_run(project, user, **body)


def test_login_page_has_labelled_fields(client):
    html = client.get("/login/").content.decode()
    assert '<label for="id_username">' in html and '<label for="id_password">' in html


def test_anonymous_is_sent_to_login(client):
    response = client.get("/training/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_training_page_lists_runs_with_filters(project, users):
    make_run(project, users["owner"], "sft")
    make_run(project, users["owner"], "dpo")
    client = client_for(users["owner"])
    html = client.get("/training/").content.decode()
    assert "sft run" in html and "dpo run" in html
    html = client.get("/training/", {"method": "dpo"}).content.decode()
    assert "dpo run" in html and "sft run" not in html
    rows = client.get("/training/", {"status": "queued"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-rows")
    assert rows.content.decode().lstrip().startswith("<tbody") and rows["Vary"].count("HX-Request")
    # Unknown filter values are ignored rather than failing.
    assert client.get("/training/", {"status": "bogus", "experiment": "x"}).status_code == 200


def test_training_page_pages_through_every_run_and_searches(project, users):
    from training.models import TrainingRun

    experiment = make_run(project, users["owner"], "sft", name="run 0").experiment
    TrainingRun.objects.bulk_create([
        TrainingRun(project=project, experiment=experiment, created_by=users["owner"], name=f"run {i}", method="sft", base_model="org/base" if i % 2 else "org/other")
        for i in range(1, 120)
    ])
    client = client_for(users["owner"])
    first = client.get("/training/").content.decode()
    assert first.count("<tr data-run=") == 50 and "Runs 1–50 of 120" in first and 'rel="next"' in first and 'rel="prev"' not in first
    last = client.get("/training/", {"page": 3}).content.decode()
    assert last.count("<tr data-run=") == 20 and "Runs 101–120 of 120" in last and 'rel="prev"' in last
    assert ">run 0</a>" in last  # the oldest run is reachable
    assert "Runs 101–120 of 120" in client.get("/training/", {"page": 99}).content.decode()  # past the end: the last page
    # Search by name or base model, with the other filters; the pager keeps them in its links.
    found = client.get("/training/", {"q": "RUN 11", "method": "sft"}).content.decode()
    assert sorted(int(n) for n in re.findall(r">run (\d+)</a>", found)) == [11, *range(110, 120)]
    other = client.get("/training/", {"q": "org/other"}).content.decode()
    assert "Runs 1–50 of 59" in other and 'href="?q=org%2Fother&amp;page=2"' in other
    # The filter form swaps the whole list (rows and pager); the 4-second poll swaps the rows of its page.
    part = client.get("/training/", {"q": "org/other", "page": 2}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-list").content.decode()
    assert part.lstrip().startswith('<div id="run-list">') and "Runs 51–59 of 59" in part
    assert 'hx-get="/training/?q=org%2Fother&amp;page=2"' in part


def test_the_api_searches_runs_by_name_and_base_model(api, project, users):
    make_run(project, users["owner"], "sft", name="Alpha")
    make_run(project, users["owner"], "sft", name="beta", base_model="acme/alphabet")
    make_run(project, users["owner"], "sft", name="gamma")
    names = [r["name"] for r in api.get("/api/training-runs", search="alpha").json()["items"]]
    assert sorted(names) == ["Alpha", "beta"]


def test_search_finds_an_accent_stored_in_either_unicode_form(api, project, users):
    make_run(project, users["owner"], "sft", name="e\u0301")  # decomposed, as macOS writes it
    make_run(project, users["owner"], "sft", name="caf\u00e9 run")  # precomposed, as typed
    make_run(project, users["owner"], "sft", name="plain e")
    for typed, expected in (("\u00e9", ["caf\u00e9 run", "e\u0301"]), ("e\u0301", ["caf\u00e9 run", "e\u0301"]), ("\u00c9", ["caf\u00e9 run", "e\u0301"])):
        assert sorted(r["name"] for r in api.get("/api/training-runs", search=typed).json()["items"]) == expected, typed
        html = client_for(users["owner"]).get("/training/", {"q": typed}).content.decode()
        assert sorted(re.findall(r"<tr data-run=[^>]*>.*?<a [^>]*>([^<]*)</a>", html, re.S)) == expected, typed


def test_training_page_is_scoped_to_the_current_project(project, other_project, users):
    make_run(other_project, users["outsider"], "sft", name="secret run")
    html = client_for(users["owner"]).get("/training/").content.decode()
    assert "secret run" not in html


@pytest.mark.parametrize("method", ["sft", "dpo", "grpo", "distill"])
def test_run_detail_has_exactly_the_methods_tabs(project, users, method):
    run = make_run(project, users["owner"], method)
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    for tab in ALL_TABS:
        present = f'data-tab="{tab}"' in html
        assert present == (tab in EXPECTED_TABS[method]), (method, tab)
        response = client.get(f"/training/runs/{run.pk}/{tab}/")
        assert response.status_code == (200 if tab in EXPECTED_TABS[method] else 404), (method, tab)


def test_grpo_ruler_mode_has_no_environment_tab(project, users):
    run = make_run(project, users["owner"], "grpo", config={"rl_mode": "ruler", "ruler_task_args": {"dataset": "p@main", "system_prompt": "be nice"}})
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert 'data-tab="environment"' not in html and 'data-tab="rollouts"' in html


def test_outsider_gets_404_and_viewer_cannot_start(project, users):
    run = make_run(project, users["owner"], "sft")
    assert client_for(users["outsider"]).get(f"/training/runs/{run.pk}/").status_code == 404
    viewer = client_for(users["viewer"])
    assert "Viewers cannot start" in viewer.get(f"/training/runs/{run.pk}/").content.decode()
    assert viewer.post(f"/training/runs/{run.pk}/start").status_code == 403
    run.refresh_from_db()
    assert run.start_requested_at is None


def test_start_button_is_disabled_with_the_422_findings(project, users):
    run = make_run(project, users["owner"], "sft", dataset=None)
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert 'id="start-btn"' in html and "disabled" in html.split('id="start-btn"')[1].split(">")[0]
    assert 'data-field="dataset"' in html
    response = client_for(users["owner"]).post(f"/training/runs/{run.pk}/start", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and 'data-field="dataset"' in response.content.decode()
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.start_requested_at is None


def test_new_run_form_creates_a_queued_run(project, users):
    client = client_for(users["owner"])
    html = client.get("/training/new/").content.decode()
    picker = html.split('id="f-method"')[1].split("</select>")[0]
    assert re.findall(r'<option value="([a-z]+)"', picker) == ["sft", "dpo", "grpo", "distill"]
    response = client.post("/training/new/", {
        "name": "form dpo", "method": "dpo", "experiment": "", "base_model": "org/base", "dataset": "prefs@main",
        "config.loss.type": "dpo", "config.loss.dpo_beta": "0.2", "config.per_device_train_batch_size": "2",
        "compute.backend": "local", "compute.accelerators": "CPU", "config_text": "lora_rank: 8\n",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    run = project.runs.get(name="form dpo")
    assert run.status == Status.QUEUED and run.start_requested_at is None
    assert run.config["loss"] == {"type": "dpo", "dpo_beta": 0.2} and run.config["lora_rank"] == 8


def test_new_run_says_a_dpo_batch_counts_rows_two_a_pair(project, users):
    client = client_for(users["owner"])
    dpo = client.get("/training/new/", {"method": "dpo"}).content.decode()
    assert "Rows (2 per pair)" in dpo.split('id="train-params"')[1].split("</div>\n      </div>")[0]
    assert "Rows (2 per pair)" not in client.get("/training/new/", {"method": "sft"}).content.decode()


def test_new_run_lists_the_default_experiment_once_and_first(project, users):
    from experiments.services import create_experiment, default_experiment

    def options() -> list[str]:
        html = client_for(users["owner"]).get("/training/new/").content.decode()
        return re.findall(r"<option[^>]*>([^<]*)</option>", html.replace("&#x27;", "'").split('id="f-experiment"')[1].split("</select>")[0])

    create_experiment(project, "alpha")
    if not project.experiments.filter(slug="default").exists():
        assert options() == ["default (the project's default)", "alpha"]  # blank: made on first use
    default_experiment(project)
    assert options() == ["default (the project's default)", "alpha"]  # it was listed twice: "Project default" and "default"


def test_new_run_form_shows_its_findings_next_to_fields(project, users):
    client = client_for(users["owner"])
    html = refused_form_page(client, "/training/new/", {
        "name": "bad distill", "method": "distill", "base_model": "org/base", "config.distillation.teacher_model": "",
        "compute.backend": "local", "config_text": "lora_rank: [",
    }, "/training/new/")
    assert 'id="f-config-text-errors"' in html
    html = refused_form_page(client, "/training/new/", {
        "name": "bad distill", "method": "distill", "base_model": "org/base", "compute.backend": "local", "config_text": "",
    }, "/training/new/")
    assert 'id="f-config-distillation-teacher-model-errors"' in html
    assert not project.runs.exists()


def test_one_new_run_answer_names_every_bad_field_even_with_one_it_cannot_parse(project, users, api):
    # A learning rate "abc" used to hide the other fields' problems until it was fixed.
    html = refused_form_page(client_for(users["owner"]), "/training/new/", {
        "name": "rounds", "method": "sft", "base_model": "org/base", "dataset": "data@main", "compute.backend": "local",
        "config.learning_rate": "abc", "config.max_steps": "0", "config.per_device_train_batch_size": "-3", "config_text": "",
    }, "/training/new/")
    for field in ("learning-rate", "max-steps", "per-device-train-batch-size"):
        assert f'id="f-config-{field}-errors"' in html, field
    assert "give a number, not &#x27;abc&#x27;" in html and "must be at least 1, got 0" in html and "got -3" in html
    assert not project.runs.exists()
    # The API, likewise: an empty name and a bad config in one 400.
    r = api.post("/api/training-runs", {"name": "", "method": "sft", "base_model": "org/base", "dataset": "d@main", "config": {"max_steps": 0, "output_dir": "/x"}})
    assert r.status_code == 400 and {e["field"] for e in r.json()["errors"]} == {"name", "config.max_steps", "config.output_dir"}, r.content


def test_distill_estimate_and_teacher_warning(project, users):
    client = client_for(users["owner"])
    html = client.get("/training/new/estimate", {"method": "distill", "config.distillation.top_k": "64", "distill_tokens": "295000",
                                                  "config.distillation.teacher_model": "Qwen/Qwen2.5-72B", "compute.accelerators": "L4:1"}, HTTP_HX_REQUEST="true").content.decode()
    assert "113.3 MB" in html and 'data-testid="teacher-warning"' in html
    html = client.get("/training/new/estimate", {"method": "distill", "config.distillation.top_k": "64", "distill_tokens": "1000",
                                                  "config.distillation.teacher_model": "Qwen/Qwen3-1.7B", "compute.accelerators": "L4:1"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-testid="teacher-warning"' not in html


def estimate_html(user, **values) -> str:
    return client_for(user).get("/training/new/estimate", {"method": "distill", "config.distillation.top_k": "64", **values}, HTTP_HX_REQUEST="true").content.decode()


def test_distill_estimate_counts_a_local_dataset_with_the_students_tokenizer(project, users, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    student = tmp_path / "student"
    student.mkdir()
    (student / "config.json").write_text('{"model_type": "llama"}')
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "one": 1, "two": 2, "three": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    (student / "tokenizer.json").write_text(words.to_str())
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "one two three"}\n' * 10)  # 3 tokens and an end token a row
    html = estimate_html(users["owner"], base_model=str(student), dataset=str(data))
    assert re.search(r'data-testid="estimate-tokens">40<', html) and "counted with the student&#x27;s tokenizer" in html
    assert re.search(r'data-testid="storage-estimate">≈ 15.4 KB<', html) and "seed 001" not in html
    # A number typed in the field wins over the count.
    typed = estimate_html(users["owner"], base_model=str(student), dataset=str(data), distill_tokens="1000")
    assert re.search(r'data-testid="estimate-tokens">1000<', typed) and "as given in the form" in typed


def test_distill_estimate_reads_a_data_hub_dataset_and_falls_back_to_the_seed_figure_labelled(project, users):
    import json

    from datahub.commits import commit_files
    from datahub.repos import create_repo

    repo = create_repo(project, "kd-data", "dataset", users["owner"])
    rows = [{"messages": [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "y" * 199}]}] * 10
    commit_files(repo, "main", {"train.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()}, message="data")
    # The student (an HF id) is not readable here: 10 rows of 400 characters at about 4 a token.
    html = estimate_html(users["owner"], base_model="org/base", dataset="kd-data@main")
    assert re.search(r'data-testid="estimate-tokens">1000<', html) and "estimated from the rows&#x27; 4,000 characters" in html
    for dataset in ("org/hf-data", "missing@main", ""):
        fallback = estimate_html(users["owner"], base_model="org/base", dataset=dataset)
        assert re.search(r'data-testid="estimate-tokens">295000<', fallback) and "an example figure (a small chat dataset&#x27;s), not this dataset&#x27;s" in fallback
        assert "seed 00" not in fallback  # the Studio's design documents are not the user's
    form = client_for(users["owner"]).get("/training/new/", {"method": "distill"}).content.decode()
    assert not re.search(r'name="distill_tokens"[^>]*value="295000"', form)  # the field starts blank: the dataset is counted


def test_distill_estimate_of_two_datasets_says_the_characters_of_both(project, users, tmp_path):
    import json

    from datahub.commits import commit_files
    from datahub.repos import create_repo

    # Each dataset: 10 rows of 400 characters (1,000 tokens at about 4 a token); the student is not readable here.
    row = json.dumps({"messages": [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "y" * 199}]}) + "\n"
    repo = create_repo(project, "kd-data", "dataset", users["owner"])
    commit_files(repo, "main", {"train.jsonl": (row * 10).encode()}, message="data")
    local = tmp_path / "distill.jsonl"
    local.write_text(row * 10)
    html = estimate_html(users["owner"], base_model="org/base", dataset=f"kd-data@main,{local}")
    assert re.search(r'data-testid="estimate-tokens">2000<', html), html
    assert "estimated from the rows&#x27; 8,000 characters" in html and "4,000 characters" not in html


def test_teacher_size_from_local_config(tmp_path):
    import json

    from training.forms import teacher_fit

    model = tmp_path / "teacher"
    model.mkdir()
    # Llama-3-70B's shape in bf16: ~70.6B parameters, ~131 GiB of weights.
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "vocab_size": 128256,
                                                   "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "torch_dtype": "bfloat16"}))
    fit = teacher_fit(str(model), "H100:8")
    assert 68e9 < fit["params"] < 72e9 and fit["too_large"] and fit["source"] == "its config.json"
    assert not teacher_fit(str(model), "B200:1")["too_large"]


def test_a_small_teachers_weights_read_in_mib_not_as_zero_gib(project, users, tmp_path):
    import json

    model = tmp_path / "small-teacher"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 3, "vocab_size": 1024,
                                                   "num_attention_heads": 4, "intermediate_size": 256, "torch_dtype": "float32"}))
    html = client_for(users["owner"]).get("/training/new/estimate", {"method": "distill", "config.distillation.teacher_model": str(model),
                                                                      "config.distillation.top_k": "64", "distill_tokens": "1000"}, HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r"The teacher needs ≈ \d+\.\d MiB for its weights", html) and "0.0 GiB" not in html


def test_overview_embeds_downsampled_chart_series(project, users):
    run = make_run(project, users["owner"], "distill")
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key=k, step=s, value=1.0 / (s + 1)) for s in range(2000) for k in ("loss", "kd_loss")])
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert "KD Loss" in html and "Training Loss (CE)" in html and 'id="chart-data"' in html


def test_rollouts_grouped_by_prompt(project, users):
    run = make_run(project, users["owner"], "grpo")
    Rollout.objects.bulk_create([Rollout(run=run, step=s, prompt=f"p{p}", completion=f"c{i}", reward=float(i), advantage=0.0) for s in (1, 2) for p in range(2) for i in range(4)])
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/rollouts/").content.decode()
    assert html.count("rollout-group") == 2 and "Step 2" in html
    html = client.get(f"/training/runs/{run.pk}/rollouts/", {"step": "all", "min_reward": "3"}).content.decode()
    assert html.count("rollout-group") == 4
    # What the filters cannot use is said beside the field, not dropped in silence.
    html = client.get(f"/training/runs/{run.pk}/rollouts/", {"step": "999", "min_reward": "abc", "max_reward": "nan"}).content.decode()
    assert "no rollouts were sampled at step 999: showing the latest step, 2" in html
    assert "&#x27;abc&#x27; is not a number: give one like 0.5 (this filter is off)" in html and 'value="abc"' in html
    assert "&#x27;nan&#x27; is not a number" in html
    assert html.count("rollout-group") == 2  # step 2, unfiltered


def test_rollouts_tab_shows_components_the_system_prompt_and_the_sample_std_of_reward_std(project, users):
    run = make_run(project, users["owner"], "grpo")
    run.config = {**(run.config or {}), "system_prompt": "Answer with digits only."}
    run.save(update_fields=["config"])
    Rollout.objects.bulk_create([
        Rollout(run=run, step=1, prompt="What is 2+2?", completion="4", reward=1.0, advantage=0.7, components={"format": 1.0, "digits": 1.0, "exact": 1.0}),
        Rollout(run=run, step=1, prompt="What is 2+2?", completion="5", reward=0.8, advantage=-0.7, components={"format": 1.0, "digits": 0.0, "exact": 0.0}),
    ])
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/rollouts/").content.decode()
    # reward_std and the advantages use the sample std (n - 1): 0.141 here, where the population std is 0.100.
    assert "reward mean 0.900, std 0.141," in html
    assert all(f"<span>{name} 1.000</span>" in html for name in ("format", "digits", "exact")) and html.count("</span> · <span>") == 4
    assert "<span>digits 0.000</span>" in html and "Answer with digits only." in html


def test_rollouts_tab_shows_each_groups_own_stats_whatever_the_reward_filter(project, users):
    # Filtered to min 0.6, a group of 0.5, 1, 1, 1 read "mean 1.000, std 0.000", while its advantages
    # and the reward metrics came from its mean 0.875 and std 0.25.
    run = make_run(project, users["owner"], "grpo")
    Rollout.objects.bulk_create([Rollout(run=run, step=s, prompt=p, completion=f"c{i}", reward=r, advantage=0.0)
                                 for s, p, rewards in ((1, "p", (0.5, 1.0, 1.0, 1.0)), (1, "q", (0.0, 0.7)), (2, "p", (0.9, 0.1)))
                                 for i, r in enumerate(rewards)])
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/rollouts/", {"step": "1", "min_reward": "0.6"}).content.decode()
    assert "Step 1 · 3 of 4 rollouts · reward mean 0.875, std 0.250, range 0.500 … 1.000" in html
    assert "Step 1 · 1 of 2 rollouts · reward mean 0.350, std 0.495, range 0.000 … 0.700" in html
    html = client.get(f"/training/runs/{run.pk}/rollouts/", {"step": "all", "max_reward": "0.5"}).content.decode()
    assert "Step 2 · 1 of 2 rollouts · reward mean 0.500, std 0.566, range 0.100 … 0.900" in html
    html = client.get(f"/training/runs/{run.pk}/rollouts/", {"step": "1"}).content.decode()
    assert "Step 1 · 4 rollouts · reward mean 0.875, std 0.250," in html


def test_rollouts_tab_shows_the_system_prompt_the_engine_reported_its_environment_set(project, users):
    from training.models import RunAttempt

    run = make_run(project, users["owner"], "grpo")  # builtin/arith@main, no system_prompt in its config
    Rollout.objects.create(run=run, step=1, prompt="What is 2+2?", completion="4", reward=1.0)
    client = client_for(users["owner"])
    assert 'data-testid="system-prompt"' not in client.get(f"/training/runs/{run.pk}/rollouts/").content.decode()
    attempt = RunAttempt.objects.create(run=run, attempt=1, config=run.config, system_prompt="Answer with digits only.")
    html = client.get(f"/training/runs/{run.pk}/rollouts/").content.decode()
    assert re.search(r'data-testid="system-prompt".*set by the environment builtin/arith@main itself.*Answer with digits only\.', html)
    # Reported as the one that attempt was configured with: named as the config's.
    RunAttempt.objects.filter(pk=attempt.pk).update(config={**run.config, "system_prompt": "Answer with digits only."})
    assert "(config.system_prompt)" in client.get(f"/training/runs/{run.pk}/rollouts/").content.decode()
    # Reported as none used: none shown, though a later edit configured one.
    RunAttempt.objects.filter(pk=attempt.pk).update(system_prompt="")
    assert 'data-testid="system-prompt"' not in client.get(f"/training/runs/{run.pk}/rollouts/").content.decode()


def test_rollouts_tab_credits_the_system_prompt_to_the_config_of_the_attempt_that_reported_it(project, users):
    from training.models import RunAttempt

    # A stopped run edited after its attempt: the prompt that attempt used came from its own config.
    run = make_run(project, users["owner"], "grpo", config={**METHOD_BODIES["grpo"]["config"], "system_prompt": "Answer with digits only."})
    Rollout.objects.create(run=run, step=1, prompt="What is 2+2?", completion="4", reward=1.0)
    RunAttempt.objects.create(run=run, attempt=1, config=run.config, system_prompt="Answer with digits only.")
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.CANCELLED, config={**run.config, "system_prompt": "Reply in words."})
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/rollouts/").content.decode()
    assert re.search(r'data-testid="system-prompt".*\(config\.system_prompt\).*Answer with digits only\.', html, re.S)
    assert "set by the environment" not in html


@pytest.mark.parametrize("step", ["²", "-1", "1.0"])
def test_rollouts_tab_takes_a_step_that_is_not_ascii_digits_as_no_step(project, users, step):
    # "²".isdigit() is True, yet int("²") raises: it was a 500.
    run = make_run(project, users["owner"], "grpo")
    Rollout.objects.bulk_create([Rollout(run=run, step=s, prompt="p", completion=f"c{i}", reward=float(i), advantage=0.0) for s in (1, 2) for i in range(2)])
    response = client_for(users["owner"]).get(f"/training/runs/{run.pk}/rollouts/", {"step": step})
    html = response.content.decode()
    assert response.status_code == 200 and "showing the latest step, 2" in html and html.count("rollout-group") == 1


def test_rollouts_api_filters_by_reward_like_the_tab(api, project, users):
    run = make_run(project, users["owner"], "grpo")
    Rollout.objects.bulk_create([Rollout(run=run, step=s, prompt="p", completion=f"c{i}", reward=float(i), advantage=0.0) for s in (1, 2) for i in range(4)])
    rewards = [r["reward"] for r in api.get(f"/api/training-runs/{run.pk}/rollouts", step=2, min_reward=1, max_reward=2.5).json()["items"]]
    assert rewards == [1.0, 2.0]
    assert api.get(f"/api/training-runs/{run.pk}/rollouts", min_reward="abc").status_code == 400
    # An inverted range said only "no rollouts match"; the API listed nothing with a 200.
    assert api.get(f"/api/training-runs/{run.pk}/rollouts", min_reward=0.9, max_reward=0.1).json()["errors"][0]["field"] == "max_reward"
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/rollouts/", {"step": "all", "min_reward": "0.9", "max_reward": "0.1"}).content.decode()
    assert "the range is empty: max 0.1 is below min 0.9; swap them" in html


def test_experiment_create_via_htmx_and_compare_page(project, users):
    client = client_for(users["owner"])
    response = client.post("/experiments/create", {"name": "tone sweep"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 201 and "tone sweep" in response.content.decode()
    dup = client.post("/experiments/create", {"name": "tone sweep"}, HTTP_HX_REQUEST="true")
    assert dup.status_code == 409 and "f-name-errors" in dup.content.decode()
    # The API's schema capped names at 200; the page's form did not (PostgreSQL then failed the insert).
    long = client.post("/experiments/create", {"name": "x" * 300}, HTTP_HX_REQUEST="true")
    assert long.status_code == 400 and "at most 200 characters; this one has 300" in long.content.decode()
    assert client.post("/experiments/create", {"name": "y" * 150 + "a"}, HTTP_HX_REQUEST="true").status_code == 201
    cut = client.post("/experiments/create", {"name": "y" * 150 + "b"}, HTTP_HX_REQUEST="true")
    assert cut.status_code == 409 and "the first 100 characters of both slugs" in cut.content.decode()
    # A clash names the experiment the list shows, not a slug nobody typed.
    client.post("/experiments/create", {"name": "bad name!"}, HTTP_HX_REQUEST="true")
    clash = client.post("/experiments/create", {"name": "bad name?"}, HTTP_HX_REQUEST="true").content.decode()
    assert "already has an experiment &#x27;bad name!&#x27;, whose slug &#x27;bad-name&#x27; this name shares" in clash
    experiment = project.experiments.get(slug="tone-sweep")
    run = make_run(project, users["owner"], "sft", experiment=experiment.pk)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=2.0 - s / 100) for s in range(50)])
    html = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "compare-chart" in html and run.name in html


def test_experiment_form_refuses_a_name_of_only_digits_beside_the_field(project, users):
    # The form calls the API's service: "12" would get the slug "12", which a run reads as experiment id 12.
    response = client_for(users["owner"]).post("/experiments/create", {"name": "12"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 400 and "f-name-errors" in html and "only digits, which reads as an experiment id" in html
    assert not project.experiments.exists()


def test_experiment_form_without_htmx_refuses_by_redirect_and_shows_the_finding_once(project, users):
    # Its refusal was drawn straight from the POST: a reload asked to resubmit the form, and sent it again.
    client = client_for(users["owner"])
    html = refused_form_page(client, "/experiments/create", {"name": "12"}, "/experiments/")
    assert "f-name-errors" in html and "only digits, which reads as an experiment id" in html and 'value="12"' in html
    reloaded = client.get("/experiments/").content.decode()
    assert "f-name-errors" not in reloaded and 'value="12"' not in reloaded
    assert not project.experiments.exists()


def test_a_refused_plain_forms_page_autofocuses_the_invalid_field_once(project, users):
    # Without JavaScript (which focuses it on load) the focus stayed on the page's body.
    client = client_for(users["owner"])
    html = refused_form_page(client, "/experiments/create", {"name": "12"}, "/experiments/")
    assert html.count("autofocus") == 1
    field = re.search(r'<input[^>]*\bid="f-name"[^>]*>', html)
    assert field and 'aria-invalid="true"' in field.group(0) and " autofocus" in field.group(0), field
    assert "autofocus" not in client.get("/experiments/").content.decode()  # a clean GET: the browser's own focus


def test_billing_page(project, users):
    html = client_for(users["member"]).get("/settings/billing/").content.decode()
    assert "team" in html and "owner" in html and "Cost so far" in html


def test_project_switcher(project, other_project, users):
    from studio.services import add_member

    add_member(other_project, users["owner"], "member")
    client = client_for(users["owner"])
    response = client.post("/projects/switch", {"project": "globex", "next": "/training/"})
    assert response.status_code == 302
    assert "globex" in client.get("/training/").content.decode()
    assert client.post("/projects/switch", {"project": "nope"}).status_code == 404


def test_repository_tab_lists_the_run_branch(project, users):
    run = make_run(project, users["owner"], "sft", dataset="org/data")
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/repository/").content.decode()
    assert f"run-{run.pk}" in html and "Commits" in html


def test_plan_without_training_refuses_with_a_billing_link(project, users, free_plan):
    from studio.services import set_plan

    set_plan(project, free_plan)
    html = refused_form_page(client_for(users["owner"]), "/training/new/", {"name": "x", "method": "sft", "compute.backend": "local", "config_text": ""},
                             "/training/new/")
    assert "Settings → Billing" in html and 'href="/settings/billing/"' in html
    assert not project.runs.exists()


def test_plan_limit_on_start_shows_402_next_to_the_button(project, users, team_plan):
    from studio.services import create_plan, set_plan

    set_plan(project, create_plan("tiny", max_concurrent_runs=0))
    run = make_run(project, users["owner"], "sft", dataset="org/data")
    response = client_for(users["owner"]).post(f"/training/runs/{run.pk}/start", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "runs 0 runs at once" in html and 'href="/settings/billing/"' in html
    run.refresh_from_db()
    assert run.start_requested_at is None


def test_failed_run_without_a_log_tail_shows_the_run_log(project, users):
    from training import status as status_service

    run = make_run(project, users["owner"], "sft", dataset="org/data")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.FAILED, error={"code": "CAPACITY_UNAVAILABLE", "message": "no H100", "log_tail": []})
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert "CAPACITY_UNAVAILABLE" in html and "another region" in html and "status → failed" in html


@pytest.mark.parametrize(("method", "blames_rewards"), [("sft", False), ("grpo", True)])
def test_a_training_error_blames_reward_functions_only_on_a_grpo_run(project, users, method, blames_rewards):
    from training import status as status_service

    run = make_run(project, users["owner"], method, dataset=None if method == "grpo" else "org/data")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.FAILED, error={"code": "training_error", "message": "bad value", "log_tail": []})
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert "read the message and the log below" in html and ("a reward function failed" in html) is blames_rewards


def test_teacher_size_from_a_data_hub_repo(project, users):
    import json

    from datahub.commits import commit_files
    from datahub.repos import create_repo
    from training.forms import teacher_fit

    repo = create_repo(project, "big-teacher", "model", users["owner"])
    cfg = {"model_type": "qwen2", "hidden_size": 5120, "num_hidden_layers": 64, "vocab_size": 152064, "num_attention_heads": 40,
           "num_key_value_heads": 8, "intermediate_size": 27648, "torch_dtype": "bfloat16"}
    commit_files(repo, "main", {"config.json": json.dumps(cfg).encode()}, message="config")
    fit = teacher_fit("big-teacher@main", "L4:1", project)
    assert fit["source"] == "its config.json in the Data Hub" and 30e9 < fit["params"] < 34e9 and fit["too_large"]
    assert not teacher_fit("big-teacher@main", "H200:1", project)["too_large"]


def test_environment_tab_describes_the_builtin(project, users):
    run = make_run(project, users["owner"], "grpo")
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/environment/").content.decode()
    assert "Built into the engine" in html and "builtin/arith@main" in html
    form = client_for(users["owner"]).get("/training/new/method", {"method": "grpo"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'list="environment-choices"' in form and '<option value="builtin/arith@main">' in form


def test_grpo_quick_try_fills_the_short_rollout_settings_and_keeps_what_was_typed(project, users):
    client = client_for(users["owner"])
    typed = {"method": "grpo", "name": "mine", "config.rl_mode": "environment", "config.environment_id": "", "config.kl_coef": "0.05",
             "config.max_steps": "500", "config.rollouts_per_prompt": "16", "config.max_response_length": "2048", "config.precision": "bf16"}
    response = client.get("/training/new/quick", typed, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and response["HX-Trigger-After-Settle"] == "change"  # the GPU estimate re-prices the new lengths
    assert html.lstrip().startswith('<div id="grpo-numbers"')
    assert re.search(r'name="config.rollouts_per_prompt"[^>]*value="8"', html) and re.search(r'name="config.max_response_length"[^>]*value="8"', html)
    assert re.search(r'name="config.kl_coef"[^>]*value="0.05"', html)  # not the preset's: kept
    # The training parameters card and the empty environment are swapped out of band.
    assert '<div id="train-params" class="grid-3" hx-swap-oob="true">' in html
    assert re.search(r'name="config.max_steps"[^>]*value="40"', html) and re.search(r'name="config.learning_rate"[^>]*value="2e-2"', html)
    assert re.search(r'<option value="bf16"[^>]*selected', html)
    assert '<div id="grpo-mode" data-mode="environment" data-drawn-for="environment" hx-swap-oob="true">' in html
    assert re.search(r'name="config.environment_id"[^>]*value="builtin/arith@main"', html)
    # An environment the user chose stays; a RULER run keeps its judge fields (no environment swap).
    html = client.get("/training/new/quick", {**typed, "config.environment_id": "acme/maze@v2"}, HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'name="config.environment_id"[^>]*value="acme/maze@v2"', html)
    html = client.get("/training/new/quick", {**typed, "config.rl_mode": "ruler"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="grpo-mode"' not in html and 'value="8"' in html
    # The form on the page has the button, inside the GRPO card.
    form = client.get("/training/new/method", {"method": "grpo"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'hx-get="/training/new/quick"' in form and 'hx-target="#grpo-numbers"' in form
    # QA: the hint said "remove lora_rank from the config", which GRPO's starter config has no longer.
    assert "remove lora_rank" not in form
    assert "a full fine-tune (GRPO's default: leave lora_rank out of the config)" in form


@pytest.mark.parametrize("path", ["/training/", "/experiments/"])
def test_list_pages_take_a_fixed_number_of_queries(project, users, django_assert_max_num_queries, path):
    for i in range(3):
        make_run(project, users["owner"], "sft", name=f"r{i}")
    client = client_for(users["owner"])
    client.get(path)
    with django_assert_max_num_queries(12) as few:
        client.get(path)
    for i in range(3, 23):
        make_run(project, users["owner"], "sft", name=f"r{i}")
    with django_assert_max_num_queries(len(few.captured_queries)):
        client.get(path)


def test_edit_keeps_unrelated_config_and_refuses_a_completed_run(project, users):
    run = make_run(project, users["owner"], "sft", dataset="org/data", config={"lora_rank": 8, "save_steps": 5, "max_steps": 10})
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/edit/").content.decode()
    assert 'value="10"' in html and "save_steps: 5" in html  # form field, and the rest as YAML
    response = client.post(f"/training/runs/{run.pk}/edit/", {"name": "renamed", "method": "sft", "base_model": "org/base", "dataset": "org/data",
                                                              "config.max_steps": "20", "compute.backend": "local", "compute.accelerators": "CPU",
                                                              "config_text": "lora_rank: 8\n"})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.name == "renamed" and run.config["max_steps"] == 20 and "save_steps" not in run.config
    from training import status as status_service

    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    status_service.transition(run.pk, Status.COMPLETED)
    assert client.get(f"/training/runs/{run.pk}/edit/").status_code == 302


def test_dpo_dataset_entry_type_finding_shows_at_the_dataset(project, users):
    client = client_for(users["owner"])
    response = client.post("/training/new/", {"name": "typed", "method": "dpo", "base_model": "org/base", "dataset": "org/prefs", "dataset_type": "chat",
                                               "config.loss.type": "dpo", "compute.backend": "local", "config_text": "lora_rank: 8\n"})
    assert response.status_code == 302
    run = project.runs.get(name="typed")
    assert run.dataset == {"ref": "org/prefs", "type": "chat"}
    html = client.get(f"/training/runs/{run.pk}/edit/").content.decode()
    assert 'id="f-dataset-errors"' in html and "preference" in html.split('id="f-dataset-errors"')[1][:400]


def test_hub_refs_link_to_the_hub_browser(project, users):
    from datahub import repos

    run = make_run(project, users["owner"], "sft", dataset="my-data@main")
    client = client_for(users["owner"])
    # A ref to no repo is not linked (its Lineage says deleted), as a deleted repo's is not.
    assert 'href="/hub/acme/my-data/tree/main"' not in client.get(f"/training/runs/{run.pk}/datasets/").content.decode()
    repos.create_repo(project, "my-data", "dataset")
    assert 'href="/hub/acme/my-data/tree/main"' in client.get(f"/training/runs/{run.pk}/datasets/").content.decode()
    lineage = client.get(f"/training/runs/{run.pk}/lineage/").content.decode()
    assert f"run-{run.pk}" in lineage and "/hub/acme/experiment-default/tree/run-" in lineage
    # A resumed run's lineage links the run it came from (it was plain text).
    from training.models import Checkpoint

    step = Checkpoint.objects.create(run=run, attempt=1, step=4, kind="checkpoint", path="/tmp/nowhere")
    child = make_run(project, users["owner"], "sft", name="child", dataset="my-data@main")
    TrainingRun.objects.filter(pk=child.pk).update(parent=run, resume_checkpoint=step)
    lineage = client.get(f"/training/runs/{child.pk}/lineage/").content.decode()
    assert f'<a href="/training/runs/{run.pk}/">run #{run.pk}: {run.name}</a>' in lineage and "Studio run" in lineage


@pytest.fixture
def run_with_checkpoint(project, users):
    run = make_run(project, users["owner"], "sft", dataset="org/data")
    Checkpoint.objects.create(run=run, attempt=1, step=3, kind="checkpoint", path="/out/checkpoint-3")
    return run


def test_checkpoint_tab_resume_makes_a_child_run_shown_in_lineage(users, run_with_checkpoint):
    client, run = client_for(users["owner"]), run_with_checkpoint
    page = client.get(f"/training/runs/{run.pk}/checkpoints/")
    assert f"/training/runs/{run.pk}/checkpoints/3/resume".encode() in page.content
    response = client.post(f"/training/runs/{run.pk}/checkpoints/3/resume")
    child = TrainingRun.objects.get(parent=run)
    assert response.status_code == 302 and response["Location"].endswith(f"/training/runs/{child.pk}/configuration/")
    assert child.resume_checkpoint.step == 3 and child.status == "queued"
    lineage = client.get(f"/training/runs/{child.pk}/lineage/").content.decode()
    assert f"run {run.pk}" in lineage and "step 3" in lineage
    # The note explains the buttons there are: Resume, and Merge only where there is one (a LoRA run).
    html = page.content.decode()
    assert "Resume from here makes a new run" in html and ("Merge folds" in html) == ("/checkpoints/3/merge" in html)
    full = make_run(run.project, users["owner"], "sft", dataset="org/data", config={"lora": False})
    Checkpoint.objects.create(run=full, attempt=1, step=3, kind="checkpoint", path="/out/checkpoint-3")
    html = client.get(f"/training/runs/{full.pk}/checkpoints/").content.decode()
    assert "/checkpoints/3/merge" not in html and "Merge folds" not in html and "Resume from here makes" in html


def test_viewer_sees_no_checkpoint_actions(users, run_with_checkpoint):
    page = client_for(users["viewer"]).get(f"/training/runs/{run_with_checkpoint.pk}/checkpoints/")
    assert page.status_code == 200 and b"/checkpoints/3/resume" not in page.content
    assert b"Download lists" in page.content and b"Resume from here" not in page.content  # nor a note about them
    assert client_for(users["viewer"]).post(f"/training/runs/{run_with_checkpoint.pk}/checkpoints/3/resume").status_code == 403
    assert not TrainingRun.objects.filter(parent=run_with_checkpoint).exists()


def test_a_tab_the_method_lacks_is_a_404_that_says_so(project, users):
    run = make_run(project, users["owner"], "grpo")
    response = client_for(users["owner"]).get(f"/training/runs/{run.pk}/datasets/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "This GRPO run has no Datasets tab: it names no dataset" in html and f'href="/training/runs/{run.pk}/rollouts/"' in html
    assert "Viewers cannot" not in html and 'id="start-btn"' in html  # the owner's own status area


def test_an_unknown_new_run_part_is_a_readable_404(project, users):
    response = client_for(users["owner"]).get("/training/new/bogus", {"method": "sft"}, HTTP_HX_REQUEST="true")  # opened directly: NEW RUN (test_fragment_urls)
    html = response.content.decode()
    assert response.status_code == 404
    assert 'NEW RUN has no live part "bogus"' in html and "method, mode, preset, quick, estimate, fit" in html


def test_checkpoints_tab_links_committed_folders_and_shows_the_merge_state(project, users, tmp_path, settings):
    from datahub import services as hub
    from training import checkpoints
    from training.backends.local import run_dir

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run = make_run(project, users["owner"], "sft", dataset="org/data", config={"lora_rank": 8})
    folder = run_dir(run.pk, 1) / "output" / "checkpoint-3"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    saved = Checkpoint.objects.create(run=run, attempt=1, step=3, kind="checkpoint", path=str(folder))
    Checkpoint.objects.create(run=run, attempt=1, step=6, kind="checkpoint", path=str(tmp_path / "checkpoint-6"))  # not committed yet
    hub.commit_checkpoint(saved.pk)
    client = client_for(users["owner"])
    url = f"/training/runs/{run.pk}/checkpoints/"
    html = client.get(url).content.decode()
    assert "?path=checkpoints/step-3" in html and "?path=checkpoints/step-6" not in html and "commit pending" in html
    assert "/checkpoints/3/merge" in html
    # Merge asked for: the button gives way to "Merging…" and the table polls until the merge ends.
    assert client.post(f"/training/runs/{run.pk}/checkpoints/3/merge").status_code == 302
    html = client.get(url).content.decode()
    assert 'data-testid="merging-3"' in html and 'hx-trigger="every 3s"' in html and "/checkpoints/3/merge" not in html
    again = client.post(f"/training/runs/{run.pk}/checkpoints/3/merge", follow=True).content.decode()
    assert "is being merged" in again
    # A merge that fails (org/base is no model here) clears the mark: Merge is offered again.
    assert checkpoints.merge(saved.pk) is None
    assert "/checkpoints/3/merge" in client.get(url).content.decode()
    # A finished merge: the poll shows "Merged" for the step, no button, and stops polling.
    Checkpoint.objects.create(run=run, attempt=1, step=3, kind="merged", path=str(tmp_path / "merged-step-3"))
    poll = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="checkpoint-table").content.decode()
    assert poll.lstrip().startswith('<div id="checkpoint-table"') and "every 3s" not in poll
    assert 'data-testid="merged-3"' in poll and "/checkpoints/3/merge" not in poll and "/checkpoints/6/merge" in poll


def test_the_checkpoints_table_follows_a_run_while_it_trains_and_a_commit_about_to_land(project, users, tmp_path, settings):
    from datahub import services as hub
    from training.backends.local import run_dir


    # It refreshed only during a merge: new steps and their Download links needed a reload.
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run = make_run(project, users["owner"], "sft", dataset="org/data", config={"save_steps": 40})
    client, url = client_for(users["owner"]), f"/training/runs/{run.pk}/checkpoints/"
    assert "every 3s" not in client.get(url).content.decode()  # queued: nothing to follow
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING)
    html = client.get(url).content.decode()
    assert 'hx-trigger="every 3s"' in html and "No checkpoints yet: one is saved every 40 steps." in html
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED)
    folder = run_dir(run.pk, 1) / "output" / "checkpoint-40"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    saved = Checkpoint.objects.create(run=run, attempt=1, step=40, kind="checkpoint", path=str(folder))
    assert 'hx-trigger="every 3s"' in client.get(url).content.decode()  # its commit is on its way
    hub.commit_checkpoint(saved.pk)
    poll = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="checkpoint-table").content.decode()
    assert "?path=checkpoints/step-40" in poll and "every 3s" not in poll


@pytest.mark.parametrize("end", [Status.FAILED, Status.CANCELLED])
def test_a_run_that_ended_before_training_shows_how_long_it_went(project, users, end):
    from datetime import timedelta

    from django.utils import timezone

    from training import status as status_service

    run = make_run(project, users["owner"], "sft", dataset="org/data")
    # What dispatch's claim writes; the run then fails (or is stopped) while provisioning.
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.PROVISIONING, attempt=1, provisioning_since=timezone.now() - timedelta(seconds=95))
    status_service.transition(run.pk, end)
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert re.search(r"Duration 1m 3[5-9]s", html), re.search(r"Duration [^<]*", html).group(0)


def test_after_logging_in_again_the_user_lands_in_the_project_used_last(project, other_project, users):
    from studio.models import Membership
    from studio.services import add_member

    add_member(other_project, users["owner"], "member")  # acme sorts first; globex is the one used
    client = Client()
    assert client.post("/login/", {"username": "owner", "password": "pw"}).status_code == 302
    assert re.search(r'<option value="acme" selected>', client.get("/training/").content.decode())
    client.post("/projects/switch", {"project": "globex", "next": "/training/"})
    assert Membership.objects.get(user=users["owner"], project=other_project).last_used_at is not None
    client.post("/logout/")
    again = Client()
    assert again.post("/login/", {"username": "owner", "password": "pw"}).status_code == 302
    assert re.search(r'<option value="globex" selected>', again.get("/training/").content.decode())


@pytest.mark.parametrize(("top_k", "shown"), [("2000", "got 2000"), ("0", "got 0"), ("lots", "got lots")])
def test_distill_estimate_shows_starts_top_k_range_instead_of_pricing_it(project, users, top_k, shown):
    html = client_for(users["owner"]).get("/training/new/estimate", {"method": "distill", "config.distillation.top_k": top_k, "distill_tokens": "295000"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-testid="estimate-finding"' in html and "integer from 1 to 1024" in html and shown in html
    assert 'data-testid="storage-estimate"' not in html
    ok = client_for(users["owner"]).get("/training/new/estimate", {"method": "distill", "config.distillation.top_k": "1024", "distill_tokens": "1000"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-testid="storage-estimate"' in ok and "estimate-finding" not in ok


def complete(run) -> None:
    from training import status as status_service

    for target in (Status.PROVISIONING, Status.RUNNING, Status.COMPLETED):
        status_service.transition(run.pk, target)


def test_pins_are_claimed_only_for_data_hub_refs_that_were_pinned(project, users):
    client = client_for(users["owner"])
    local = make_run(project, users["owner"], "sft", dataset="/data/train.jsonl")
    hub = make_run(project, users["owner"], "sft", dataset="my-data@main")
    queued = client.get(f"/training/runs/{hub.pk}/datasets/").content.decode()
    assert "pinned at START" in queued
    TrainingRun.objects.filter(pk=hub.pk).update(pinned={"dataset": {"ref": "my-data@main", "commit": "c0ffee" * 10, "repo": "acme/my-data"}})  # what START records
    grpo = make_run(project, users["owner"], "grpo")
    for run in (local, hub, grpo):
        complete(run)
    html = client.get(f"/training/runs/{local.pk}/datasets/").content.decode()
    assert "local path (not versioned)" in html and "pinned at START" not in html
    assert "c0ffee" * 10 in client.get(f"/training/runs/{hub.pk}/datasets/").content.decode()
    env = client.get(f"/training/runs/{grpo.pk}/environment/").content.decode()
    pin = re.search(r'data-testid="environment-pin">(.*?)</td>', env).group(1)
    assert "built in (not versioned)" in pin and "pinned at START" not in env


@pytest.mark.parametrize(("accelerators", "config", "shown"), [
    ("CPU", {}, "fp32 (CPU run)"),
    ("CPU", {"precision": "bf16"}, "fp32 (CPU run; bf16 applies on a GPU only)"),
    ("H100:1", {}, "bf16 (default)"),
    ("H100:1", {"precision": "fp32"}, "fp32"),
])
def test_configuration_tab_shows_the_precision_the_run_trains_in(project, users, accelerators, config, shown):
    run = make_run(project, users["owner"], "sft", dataset="org/data", config=config, compute={"backend": "local", "accelerators": accelerators})
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/configuration/").content.decode()
    assert re.search(r'data-testid="precision">([^<]*)<', html).group(1) == shown


def shown_fields(html: str) -> dict[str, str]:
    """The edit form as a browser would post it untouched: inputs' values, selects' selected options."""
    form = {name: value for name, value in re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', html) if name != "csrfmiddlewaretoken"}
    for name, body in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        form[name] = (re.findall(r'<option value="([^"]*)"[^>]*selected', body) or [""])[0]
    form["config_text"] = html.split('name="config_text"')[1].split(">", 1)[1].split("</textarea>")[0].strip("\n")
    return {k: v.replace("&#x27;", "'").replace("&quot;", '"').replace("&amp;", "&") for k, v in form.items()}


def test_saving_the_edit_form_untouched_keeps_a_list_of_datasets(project, users):
    # The form showed a list dataset as an empty field, and saving it untouched set dataset to null.
    mixed = [{"ref": "prefs@main", "type": "preference"}, "more-prefs@v2"]
    run = make_run(project, users["owner"], "dpo", dataset=mixed)
    client = client_for(users["owner"])
    form = shown_fields(client.get(f"/training/runs/{run.pk}/edit/").content.decode())
    assert form["dataset"] == "prefs@main, more-prefs@v2"
    assert client.post(f"/training/runs/{run.pk}/edit/", form).status_code == 302
    run.refresh_from_db()
    assert run.dataset == mixed
    # Changed, the field's comma-separated refs become the list, each with the chosen type.
    response = client.post(f"/training/runs/{run.pk}/edit/", {**form, "dataset": "prefs@main, other@main", "dataset_type": "preference"})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.dataset == [{"ref": "prefs@main", "type": "preference"}, {"ref": "other@main", "type": "preference"}]
    assert shown_fields(client.get(f"/training/runs/{run.pk}/edit/").content.decode())["dataset_type"] == "preference"


def test_editing_a_completed_run_says_to_create_a_new_one_not_to_stop_it(project, users, api):
    run = make_run(project, users["owner"], "sft", dataset="org/data")
    complete(run)
    expected = "A completed run cannot be changed: create a new run (or resume from one of its checkpoints)."
    patch = api.patch(f"/api/training-runs/{run.pk}", {"name": "new"})
    assert patch.status_code == 409 and patch.json()["detail"] == expected
    page = client_for(users["owner"]).get(f"/training/runs/{run.pk}/edit/", follow=True).content.decode()
    assert expected in page and "stop it first" not in page
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING)
    assert "A running run cannot be changed: stop it first" in api.patch(f"/api/training-runs/{run.pk}", {"name": "new"}).json()["detail"]
    assert TrainingRun.objects.get(pk=run.pk).name == "sft run"


def test_a_viewer_is_told_why_new_run_is_not_for_them_on_a_studio_page(project, users, settings):
    settings.DEBUG = False  # the production error pages
    client = client_for(users["viewer"])
    response = client.get("/training/new/")
    html = response.content.decode()
    assert response.status_code == 403
    assert "Viewers cannot change anything in project acme: ask an owner for the member role." in html
    assert 'href="/training/"' in html and "Log out" in html  # the Studio's page, with its navigation
    missing = client.get("/no/such/page/")
    assert missing.status_code == 404 and "There is nothing at this address." in missing.content.decode()


def test_a_grpo_run_without_kl_says_why_its_kl_chart_is_empty(project, users):
    run = make_run(project, users["owner"], "grpo")  # kl_coef 0, seed 002's default
    MetricPoint.objects.create(run=run, key="reward", step=1, value=0.5)
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert "No KL: it is measured against a reference model, which a run with kl_coef 0 does not load." in html
    with_kl = make_run(project, users["owner"], "grpo", name="with kl", config={**METHOD_BODIES["grpo"]["config"], "kl_coef": 0.05})
    assert "No KL:" not in client_for(users["owner"]).get(f"/training/runs/{with_kl.pk}/").content.decode()


def test_new_run_grpo_defaults_to_a_full_fine_tune_as_seed_002_says(project, users):
    # The config box held lora_rank: 16 beside a blank learning rate (1e-6, sized for a full fine-tune):
    # a LoRA run at a full fine-tune's rate, unlike the API's default and seed 002's.
    from training.forms import DEFAULT_CONFIG_TEXT

    client = client_for(users["owner"])
    page = client.get("/training/new/?method=grpo").content.decode()
    box = page.split('name="config_text"')[1].split("</textarea>")[0]
    assert "Full fine-tune" in box and "\nlora_rank" not in box and "2e-5" in box
    # The picker swaps the box too while it holds a method's default text (SFT's LoRA one, here), and leaves a typed one.
    card = client.get("/training/new/method", {"method": "grpo", "config_text": DEFAULT_CONFIG_TEXT["sft"]}, HTTP_HX_REQUEST="true").content.decode()
    assert '<div id="config-box" hx-swap-oob="true">' in card and "Full fine-tune" in card
    card = client.get("/training/new/method", {"method": "grpo", "config_text": "lora_rank: 8\n"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="config-box"' not in card
    response = client.post("/training/new/", {
        "name": "form grpo", "method": "grpo", "experiment": "", "base_model": "org/base", "config.rl_mode": "environment",
        "config.environment_id": "builtin/arith@main", "config.rollouts_per_prompt": "8", "config.max_response_length": "8",
        "compute.backend": "local", "compute.accelerators": "CPU", "config_text": box.split(">", 1)[1].replace("&#x27;", "'"),
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    run = project.runs.get(name="form grpo")
    assert run.config.get("lora_rank") is None and run.config["learning_rate"] == 1e-6


def test_new_run_distill_leaves_ce_weight_blank_so_it_follows_kd_weight(project, users):
    # QA: the form prefilled ce_weight 0.5, so any kd_weight trained with ce_weight 0.5, not 1 − kd_weight.
    client = client_for(users["owner"])
    page = client.get("/training/new/?method=distill").content.decode()
    field = page.split('name="config.distillation.ce_weight"')[1].split(">")[0]
    assert 'value=""' in field or "value=" not in field, field
    body = {"method": "distill", "experiment": "", "base_model": "org/base", "dataset": "chats@main", "config.distillation.teacher_model": "org/teacher",
            "config.distillation.top_k": "64", "config.distillation.temperature": "1.0", "config.distillation.kd_weight": "0.8",
            "compute.backend": "local", "compute.accelerators": "CPU", "config_text": "lora_rank: 16\n"}
    for name, ce_weight, stored in (("follows", "", 0.2), ("typed", "0.3", 0.3)):
        response = client.post("/training/new/", {**body, "name": name, "config.distillation.ce_weight": ce_weight})
        assert response.status_code == 302, response.content.decode()[:2000]
        assert project.runs.get(name=name).config["distillation"]["ce_weight"] == pytest.approx(stored)


def test_a_right_to_left_run_name_is_isolated_from_its_id(project, users):
    client = client_for(users["owner"])
    run = make_run(project, users["owner"], "sft", name="\u05e9\u05dc\u05d5\u05dd 2")  # Hebrew: a bidi override is refused since
    assert f"<h1><bdi>\u05e9\u05dc\u05d5\u05dd 2</bdi> <span class=\"muted\">#{run.pk}</span>" in client.get(f"/training/runs/{run.pk}/").content.decode()
    assert "td.name > a { unicode-bidi: isolate; }" in (Path(__file__).resolve().parents[2] / "static/css/studio.css").read_text()


BIDI_NAME = "\u202egrpo-sys"  # RIGHT-TO-LEFT OVERRIDE: refused since, but a run stored before may have it


def test_new_run_refuses_a_bidi_override_in_the_name_naming_it(project, users):
    html = refused_form_page(client_for(users["owner"]), "/training/new/", {
        "name": BIDI_NAME, "method": "grpo", "experiment": "", "base_model": "org/base", "dataset": "",
        "config.rl_mode": "environment", "config.environment_id": "builtin/arith@main", "compute.backend": "local", "config_text": "",
    }, "/training/new/")
    assert 'id="f-name-errors"' in html, html[:2000]
    assert "a run name cannot contain U+202E (RIGHT-TO-LEFT OVERRIDE)" in html
    assert not project.runs.exists()


def test_a_bidi_override_in_a_run_name_stays_inside_the_name_in_the_studios_messages(project, users):
    client = client_for(users["owner"])
    run = make_run(project, users["owner"], "grpo", name="grpo-sys")
    TrainingRun.objects.filter(pk=run.pk).update(name=BIDI_NAME, status=Status.RUNNING)  # as a Studio before the rule stored it
    assert f"Stop \u2068{BIDI_NAME}\u2069? Partial training" in client.get(f"/training/runs/{run.pk}/").content.decode()
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.CANCELLED)
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert f'hx-confirm="Delete \u2068{BIDI_NAME}\u2069? Its metrics' in html
    html = client.post(f"/training/runs/{run.pk}/delete", follow=True).content.decode()
    assert f"Run #{run.pk} (\u2068{BIDI_NAME}\u2069) was deleted." in html


@pytest.mark.parametrize("method", ["sft", "dpo", "grpo", "distill"])
def test_new_run_names_no_design_document(project, users, method):
    # QA: GRPO's config box said "# Full fine-tune (seed 002's default)": users do not know the seed documents.
    client = client_for(users["owner"])
    html = client.get("/training/new/", {"method": method}).content.decode()
    html += client.get("/training/new/estimate", {"method": method, "config.distillation.top_k": "64"}, HTTP_HX_REQUEST="true").content.decode()
    assert "seed 00" not in html.lower()
