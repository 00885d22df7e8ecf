"""The README's REST quick start against a Studio: its shell block run as written (bash and curl) starts
the run it created, not run 1, and every request body it gives (SFT, DPO, GRPO, DISTILL) is created
and passes START's checks on the demo model and datasets."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, sft_body
from training import services
from training.models import TrainingRun

SECTION = (REPO_ROOT / "README.md").read_text().split("## Train something (REST)", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```bash\n(.*?)```", SECTION, re.S)


def demo_folder(root: Path, tiny_models: dict[str, str]) -> Path:
    """var/ as bootstrapdemo leaves it: var/demo/tiny-student, tiny-teacher and datasets/*.jsonl."""
    demo = root / "var" / "demo"
    demo.mkdir(parents=True)
    for name in ("student", "teacher"):
        (demo / f"tiny-{name}").symlink_to(tiny_models[name])
    (demo / "datasets").symlink_to(Path(tiny_models["data_sft"]).parent)
    return demo


def every_body(demo: Path) -> list[dict]:
    return [json.loads(raw.replace("'$DEMO'", str(demo))) for block in BLOCKS for raw in re.findall(r"create '(\{.*?\})'\)", block, re.S)]


def bodies(demo: Path) -> dict[str, dict]:
    """Each method's first body (a later one shows a feature: held-out evaluation)."""
    found: dict[str, dict] = {}
    for body in every_body(demo):
        found.setdefault(body["method"], body)
    return found


def test_the_readme_gives_a_body_for_every_method_and_each_can_start(api, tmp_path, tiny_models):
    demo = demo_folder(tmp_path, tiny_models)
    assert sorted(bodies(demo)) == ["distill", "dpo", "grpo", "sft"]
    for body in every_body(demo):
        r = api.post("/api/training-runs", body)
        assert r.status_code == 201, (body["name"], r.content)
        run = TrainingRun.objects.get(pk=r.json()["id"])
        assert [(f.field, f.message) for f in services.start_blockers(run)] == [], body["name"]


@pytest.mark.django_db(transaction=True)
def test_the_readme_quick_start_starts_the_run_it_created(live_server, tokens, api, tmp_path, tiny_models):
    # QA: it POSTed /api/training-runs/1/start, another run for anyone who had made one before.
    assert not re.search(r"training-runs/\d", SECTION)
    earlier = api.post("/api/training-runs", sft_body(name="made before")).json()["id"]
    demo_folder(tmp_path, tiny_models)
    (tmp_path / "var" / "demo-token").write_text(tokens["owner"] + "\n")
    script = BLOCKS[0].replace("localhost:8000", live_server.url.removeprefix("http://")) + 'echo; echo "RUN=$RUN"\n'  # curl's answers end without a newline
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"^RUN=(\d+)$", done.stdout, re.M)
    assert found, done.stdout + done.stderr
    run_id = int(found.group(1))
    run = TrainingRun.objects.get(pk=run_id)
    assert run.pk != earlier and run.name == "first sft" and run.start_requested_at is not None
    assert TrainingRun.objects.get(pk=earlier).start_requested_at is None
    assert '"series"' in done.stdout  # the metrics answer, of this run
    # QA: the README said the metrics call answers {"loss": []}; it is {"series": {"loss": [...]}, ...}.
    said = json.loads(re.search(r"The metrics call answers `(\{.*?\})` until", SECTION)[1])
    answer = json.loads(done.stdout[done.stdout.rindex('{"series"'):].splitlines()[0])
    assert set(said) == set(answer) and set(said["series"]) == set(answer["series"]) == {"loss"}

    # A body the API refuses prints the answer with its findings, and the script stops there.
    refused = BLOCKS[0].split("RUN=$(create", 1)[0].replace("localhost:8000", live_server.url.removeprefix("http://"))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", refused + """RUN=$(create '{"name": "bad", "method": "sft", "config": {"max_steps": 0}}')\necho reached"""],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "reached" not in done.stdout and "config.max_steps" in done.stderr


@pytest.mark.worker
def test_the_readme_bodies_of_dpo_grpo_and_distill_train(api, studio_worker, tmp_path, tiny_models):
    from tests.conftest import wait_for
    from training.models import Status

    examples = bodies(demo_folder(tmp_path, tiny_models))
    for method in ("dpo", "grpo", "distill"):  # one after another: the plan caps runs at once
        run_id = api.post("/api/training-runs", examples[method]).json()["id"]
        assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202, method
        run = wait_for(lambda run_id=run_id: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 600, interval=1, message=f"run {run_id} to end")
        assert run.status == Status.COMPLETED, (method, run.error)
