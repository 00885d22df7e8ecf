"""The run read endpoints: the list (pagination, filters, query count), metrics, logs, rollouts and
checkpoints. Rows the engine would report are inserted directly: these tests are about reading."""
from __future__ import annotations

import json
import random

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from experiments.services import create_experiment, default_experiment
from studio import crypto
from tests.conftest import assert_error, sft_body
from training.models import LOG_LINE_CHARS, Checkpoint, LogLine, MetricPoint, Rollout, Status, TrainingRun
from training.queries import LOGS_MAX_CHARS, LOGS_MAX_LINES


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_runs(project, n: int, *, method: str = "sft", status: str = Status.QUEUED, experiment=None) -> list[TrainingRun]:
    experiment = experiment or default_experiment(project)
    return [
        TrainingRun.objects.create(project=project, experiment=experiment, name=f"{method} {status} {i}", method=method, status=status,
                                   base_model="org/base", dataset="org/data", config={}, compute={"backend": "local"})
        for i in range(n)
    ]


def get(api, path: str, query: dict):
    """GET with any query (conftest's Api.get cannot take a `method` parameter)."""
    return api.client.get(path, query, HTTP_AUTHORIZATION=f"Bearer {api.token}")


def untimed(answer: dict) -> dict:
    """A logs answer without its times (one per line; tests/test_run_outputs_api.py checks them) and
    its `last` (test_a_live_runs_log_is_followed_from_each_answers_last checks it)."""
    assert len(answer.pop("times")) == len(answer["lines"])
    assert isinstance(answer.pop("last"), int)
    return answer


@pytest.fixture
def run(project):
    return make_runs(project, 1)[0]


# ---- list ----------------------------------------------------------------------------------------

def test_list_paginates_with_limit_offset_and_count(api, project):
    runs = make_runs(project, 7)
    newest_first = [r.pk for r in reversed(runs)]
    page = api.get("/api/training-runs", limit=3, offset=2)
    assert page.status_code == 200, page.content
    body = page.json()
    assert body["count"] == 7
    assert [r["id"] for r in body["items"]] == newest_first[2:5]
    assert [r["id"] for r in api.get("/api/training-runs", limit=3, offset=6).json()["items"]] == newest_first[6:]
    assert api.get("/api/training-runs", limit=3, offset=50).json()["items"] == []


def test_list_has_more_says_whether_another_page_follows(api, project):
    make_runs(project, 7)
    assert api.get("/api/training-runs", limit=3, offset=0).json()["has_more"] is True
    assert api.get("/api/training-runs", limit=3, offset=4).json()["has_more"] is False
    assert api.get("/api/training-runs", limit=7).json()["has_more"] is False


def page_ids(api, **query) -> tuple[list[int], bool]:
    response = get(api, "/api/training-runs", query)
    assert response.status_code == 200, response.content
    return [r["id"] for r in response.json()["items"]], response.json()["has_more"]


def test_paging_by_after_sees_every_run_once_while_runs_are_created_and_deleted(api, project):
    # QA: by offset, a run created between two pages showed a run again and a deletion skipped one; ?after= was a 400.
    runs = make_runs(project, 10)
    newest_first = [r.pk for r in reversed(runs)]
    first, more = page_ids(api, limit=3)
    assert first == newest_first[:3] and more
    make_runs(project, 2)  # newer than every run paged: they go before the first page
    TrainingRun.objects.filter(pk__in=[newest_first[1], newest_first[4]]).delete()  # one seen, one still to come
    second, more = page_ids(api, limit=3, after=first[-1])
    assert second == [newest_first[3], newest_first[5], newest_first[6]] and more
    make_runs(project, 1)
    TrainingRun.objects.filter(pk=newest_first[7]).delete()
    third, more = page_ids(api, limit=3, after=second[-1])
    assert third == newest_first[8:] and not more
    seen = first + second + third
    assert len(seen) == len(set(seen)) == 8
    assert set(seen) == set(newest_first) - {newest_first[4], newest_first[7]}  # every run there throughout, once; the deleted ones as they went


def test_paging_by_after_keeps_the_filters_and_a_run_that_left_them_still_marks_the_place(api, project):
    sweep = create_experiment(project, "Sweep")
    dpo = make_runs(project, 4, method="dpo", experiment=sweep)
    make_runs(project, 3)
    everything = api.get("/api/training-runs").json()["count"]
    first, more = page_ids(api, limit=2, method="dpo", status="queued")
    assert first == [dpo[3].pk, dpo[2].pk] and more
    TrainingRun.objects.filter(pk=dpo[2].pk).update(status=Status.FAILED)  # the page's last run leaves the status filter
    second, more = page_ids(api, limit=2, method="dpo", status="queued", after=dpo[2].pk)
    assert second == [dpo[1].pk, dpo[0].pk] and not more
    body = get(api, "/api/training-runs", {"method": "dpo", "after": dpo[1].pk}).json()
    assert body["count"] == 4 and [r["id"] for r in body["items"]] == [dpo[0].pk]  # count: every run the filters list, as with offset
    assert api.get("/api/training-runs").json()["count"] == everything


def test_paging_after_a_deleted_or_another_projects_run_is_400_naming_after(api, project, other_project):
    gone, kept = make_runs(project, 2)
    TrainingRun.objects.filter(pk=gone.pk).delete()
    body = assert_error(api.get("/api/training-runs", after=gone.pk), 400, "after")
    message = body["errors"][0]["message"]
    assert f"run {gone.pk} is not in this project's runs" in message and "the run before it on that page" in message and "leave after out" in message
    theirs = make_runs(other_project, 1)[0]
    foreign = assert_error(api.get("/api/training-runs", after=theirs.pk), 400, "after")
    assert foreign["errors"][0]["message"] == message.replace(str(gone.pk), str(theirs.pk))  # the same words: another project's ids are not confirmed
    assert page_ids(api, after=kept.pk) == ([], False)


@pytest.mark.parametrize("after", ["0", "x", str(2**63)])
def test_list_with_an_after_that_is_no_run_id_is_400_naming_it(api, run, after):
    assert_error(api.get("/api/training-runs", after=after), 400, "after")


def test_after_and_offset_together_is_400_naming_both(api, run):
    body = assert_error(api.get("/api/training-runs", after=run.pk, offset=0), 400, "offset")
    assert [e["field"] for e in body["errors"]] == ["offset", "after"]


def test_list_item_has_the_run_fields(api, run):
    item = api.get("/api/training-runs").json()["items"][0]
    assert item["id"] == run.pk and item["project"] == "acme" and item["experiment"]["slug"] == "default"
    assert {"method", "base_model", "dataset", "config", "compute", "status", "error", "created_at", "started_at", "finished_at", "cost"} <= set(item)
    assert "ingest_token_hash" not in item and "backend_job_id" not in item


def test_list_filters_by_status_method_and_experiment(api, project):
    sweep = create_experiment(project, "Sweep")
    queued = make_runs(project, 2)
    failed = make_runs(project, 1, status=Status.FAILED)
    dpo = make_runs(project, 2, method="dpo", experiment=sweep)

    def ids(**query):
        response = get(api, "/api/training-runs", query)
        assert response.status_code == 200, response.content
        return sorted(r["id"] for r in response.json()["items"])

    assert ids(status="failed") == [r.pk for r in failed]
    assert ids(status="queued") == sorted(r.pk for r in queued + dpo)
    assert ids(method="dpo") == sorted(r.pk for r in dpo)
    assert ids(experiment="sweep") == sorted(r.pk for r in dpo)
    assert ids(experiment=str(sweep.pk)) == sorted(r.pk for r in dpo)
    assert ids(experiment="Sweep", method="sft") == []
    # An unknown experiment is a 400 as at create, not an empty list that reads as "no runs there yet".
    body = assert_error(get(api, "/api/training-runs", {"experiment": "no-such-experiment"}), 400, "experiment")
    assert "No experiment 'no-such-experiment'" in body["detail"]
    everything = sorted(r.pk for r in queued + failed + dpo)
    assert ids(status="", method="", experiment="", search="") == everything  # an empty filter filters nothing
    assert api.get("/api/training-runs", status="failed").json()["count"] == 1


@pytest.mark.parametrize("query, field", [
    ({"status": "exploded"}, "status"),
    ({"status": "QUEUED"}, "status"),
    ({"method": "ppo"}, "method"),
    ({"limit": "-1"}, "limit"),
    ({"limit": "many"}, "limit"),
    ({"offset": "-5"}, "offset"),
])
def test_list_with_invalid_query_is_400_naming_it(api, run, query, field):
    assert_error(get(api, "/api/training-runs", query), 400, field)


def test_list_never_shows_another_projects_runs(api, api_as, project, other_project):
    make_runs(project, 2)
    make_runs(other_project, 3)
    assert api.get("/api/training-runs").json()["count"] == 2
    assert api_as("outsider").get("/api/training-runs").json()["count"] == 3


def count_list_queries(api) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = api.get("/api/training-runs", limit=100)
    assert response.status_code == 200
    return len(ctx.captured_queries)


def test_list_query_count_does_not_grow_with_runs(api, project, django_assert_max_num_queries):
    sweep = create_experiment(project, "Sweep")
    make_runs(project, 2)
    api.get("/api/training-runs")  # the token's last_used_at write happens once a minute: not on the pinned calls
    few = count_list_queries(api)
    make_runs(project, 20, experiment=sweep)
    make_runs(project, 20, method="grpo", status=Status.RUNNING)
    assert count_list_queries(api) == few
    # token, membership, count, page, and for the page's published_model its model repos and final
    # checkpoints: 6, whatever the number of runs.
    with django_assert_max_num_queries(6):
        assert api.get("/api/training-runs", limit=100).json()["count"] == 42
    last = api.get("/api/training-runs", limit=10).json()["items"][-1]["id"]
    # and by after, the run it pages after: 7.
    with django_assert_max_num_queries(7):
        assert len(api.get("/api/training-runs", limit=100, after=last).json()["items"]) == 32


# ---- metrics -------------------------------------------------------------------------------------

@pytest.fixture
def metric_run(run):
    loss = [MetricPoint(run=run, key="loss", step=step, value=10.0 - step / 100) for step in range(500)]
    kd = [MetricPoint(run=run, key="kd_loss", step=step, value=float(step)) for step in range(0, 30, 3)]
    other = [MetricPoint(run=run, key="reward", step=step, value=1.0) for step in range(5)]
    rows = loss + kd + other
    random.Random(7).shuffle(rows)  # inserted out of order: the endpoint must order by step
    MetricPoint.objects.bulk_create(rows)
    return run


def test_metrics_returns_requested_series_step_ordered_and_downsampled(api, metric_run):
    response = api.get(f"/api/training-runs/{metric_run.pk}/metrics", keys="loss,kd_loss", max_points=50)
    assert response.status_code == 200, response.content
    series = response.json()["series"]
    assert set(series) == {"loss", "kd_loss"}
    loss = series["loss"]
    assert 2 < len(loss) <= 50
    steps = [s for s, _ in loss]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert loss[0] == [0, 10.0] and loss[-1] == [499, pytest.approx(10.0 - 4.99)]
    assert all(4.9 <= v <= 10.0 for _, v in loss)
    # A series shorter than max_points comes back whole.
    assert series["kd_loss"] == [[s, float(s)] for s in range(0, 30, 3)]


def test_metrics_without_keys_returns_every_series(api, metric_run):
    series = api.get(f"/api/training-runs/{metric_run.pk}/metrics").json()["series"]
    assert set(series) == {"loss", "kd_loss", "reward"}
    assert len(series["loss"]) == 500  # under the default max_points: not downsampled


def test_metrics_answers_every_key_asked_for_with_an_empty_series_when_it_has_no_points(api, metric_run):
    # A chart that asks for loss and a metric the engine has not reported yet gets both keys back.
    assert api.get(f"/api/training-runs/{metric_run.pk}/metrics", keys="nope").json() == {"series": {"nope": []}, "known_keys": ["kd_loss", "loss", "reward"],
                                                                                         "unknown": ["nope"], "last_step": None}
    series = api.get(f"/api/training-runs/{metric_run.pk}/metrics", keys="kd_loss,nope,kd_loss").json()["series"]
    assert list(series) == ["kd_loss", "nope"] and series["nope"] == [] and len(series["kd_loss"]) == 10


def test_metrics_max_points_two_keeps_first_and_last(api, metric_run):
    loss = api.get(f"/api/training-runs/{metric_run.pk}/metrics", keys="loss", max_points=2).json()["series"]["loss"]
    assert [s for s, _ in loss] == [0, 499]


@pytest.mark.parametrize("max_points", ["1", "0", "-3", "lots", "100001"])
def test_metrics_with_bad_max_points_is_400(api, metric_run, max_points):
    assert_error(api.get(f"/api/training-runs/{metric_run.pk}/metrics", keys="loss", max_points=max_points), 400, "max_points")


def test_metrics_after_step_returns_only_later_points_and_the_last_step_to_follow_with(api, metric_run):
    body = api.get(f"/api/training-runs/{metric_run.pk}/metrics", after_step=20).json()
    # reward has no point after step 20: left out, as a key without points is without keys
    assert set(body["series"]) == {"loss", "kd_loss"} and body["known_keys"] == ["kd_loss", "loss", "reward"]
    assert body["series"]["kd_loss"] == [[21, 21.0], [24, 24.0], [27, 27.0]]
    assert [s for s, _ in body["series"]["loss"]] == list(range(21, 500)) and body["last_step"] == 499
    # with keys, every key asked for, [] for one without later points
    asked = api.get(f"/api/training-runs/{metric_run.pk}/metrics", keys="reward,kd_loss", after_step=24).json()
    assert asked["series"] == {"kd_loss": [[27, 27.0]], "reward": []} and asked["last_step"] == 27
    # nothing since: the given after_step back, to ask with again
    assert api.get(f"/api/training-runs/{metric_run.pk}/metrics", after_step=499).json() | {"known_keys": []} == {
        "series": {}, "known_keys": [], "unknown": [], "last_step": 499}


def test_a_live_runs_metrics_are_followed_from_each_answers_last_step(api, run):
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=step, value=float(step)) for step in range(1, 4)])
    first = api.get(f"/api/training-runs/{run.pk}/metrics").json()
    assert first["series"] == {"loss": [[1, 1.0], [2, 2.0], [3, 3.0]]} and first["last_step"] == 3
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key=key, step=4, value=0.5) for key in ("loss", "eval_loss")])
    since = api.get(f"/api/training-runs/{run.pk}/metrics", after_step=first["last_step"]).json()
    assert since["series"] == {"eval_loss": [[4, 0.5]], "loss": [[4, 0.5]]} and since["last_step"] == 4
    # An ended run's answers are cached: one after a step is not the whole series'.
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED)
    assert len(api.get(f"/api/training-runs/{run.pk}/metrics", keys="loss").json()["series"]["loss"]) == 4
    assert api.get(f"/api/training-runs/{run.pk}/metrics", keys="loss", after_step=2).json()["series"]["loss"] == [[3, 3.0], [4, 0.5]]


@pytest.mark.parametrize("gaps", [False, True])
def test_metrics_after_step_downsample_the_later_points_among_themselves(api, run, gaps):
    """Both SQL paths: a dense series (a bucket is a range of steps) and one with gaps and a repeated step (the walk)."""
    from training.metrics import downsample

    steps = [s for s in range(300) if not gaps or s % 7] + ([150] if gaps else [])
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=float(s % 13)) for s in steps])
    later = sorted((s, float(s % 13)) for s in steps if s > 100)
    got = api.get(f"/api/training-runs/{run.pk}/metrics", keys="loss", after_step=100, max_points=10).json()
    assert got["series"]["loss"] == [[s, pytest.approx(v)] for s, v in downsample(later, 10)]
    assert got["series"]["loss"][0][0] == later[0][0] and got["last_step"] == 299  # the first and last later points as they are


@pytest.mark.parametrize("after_step", ["-1", "x", "1.5", str(2**31)])
def test_metrics_with_bad_after_step_is_400_naming_it(api, metric_run, after_step):
    assert_error(api.get(f"/api/training-runs/{metric_run.pk}/metrics", after_step=after_step), 400, "after_step")


# ---- logs ----------------------------------------------------------------------------------------

@pytest.fixture
def log_run(run):
    LogLine.objects.bulk_create([LogLine(run=run, line=f"line {i}") for i in range(300)])
    return run


def test_logs_tail_by_default(api, log_run):
    body = api.get(f"/api/training-runs/{log_run.pk}/logs").json()
    assert body["total"] == 300
    assert body["lines"] == [f"line {i}" for i in range(100, 300)]


def test_logs_tail_n(api, log_run):
    assert api.get(f"/api/training-runs/{log_run.pk}/logs", tail=5).json()["lines"] == [f"line {i}" for i in range(295, 300)]


def test_logs_full(api, log_run):
    body = api.get(f"/api/training-runs/{log_run.pk}/logs", full="true").json()
    assert body["lines"] == [f"line {i}" for i in range(300)] and body["total"] == 300


def test_logs_page_forward_with_after_and_next(api, log_run):
    first_id = LogLine.objects.filter(run=log_run).order_by("id").values_list("id", flat=True)[0]
    seen, after, pages = [], 0, 0
    while after is not None:
        body = api.get(f"/api/training-runs/{log_run.pk}/logs", after=after, limit=128).json()
        assert body["total"] == 300 and len(body["lines"]) <= 128
        seen += body["lines"]
        after, pages = body["next"], pages + 1
    assert seen == [f"line {i}" for i in range(300)] and pages == 3
    # A cursor is a line id: the lines after it, whatever its page was.
    assert untimed(api.get(f"/api/training-runs/{log_run.pk}/logs", after=first_id + 297).json()) == {"lines": ["line 298", "line 299"], "total": 300, "next": None}


def report_logs(run_id: int, token: str, batch_id: str, lines: list[str]) -> None:
    """Lines as an engine reports them: a batch to the ingest API with the attempt's token."""
    r = Client().post(f"/api/ingest/runs/{run_id}", data=json.dumps({"batch_id": batch_id, "logs": lines}), content_type="application/json",
                      HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 200, r.content


def test_a_live_runs_log_is_followed_from_each_answers_last(api):
    # QA: `next` is null once a page reaches the end of the log as it is, so a client polling a running
    # run had no cursor to go on from and read the log from 0 again.
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run_id).update(status=Status.RUNNING, attempt=1, ingest_token_hash=crypto.hash_token(token))
    url = f"/api/training-runs/{run_id}/logs"
    empty = api.get(url, after=0).json()
    assert empty["lines"] == [] and empty["next"] is None and empty["last"] == 0
    report_logs(run_id, token, "b1", ["step 1", "step 2"])
    first = api.get(url, after=empty["last"]).json()
    assert first["lines"] == ["step 1", "step 2"] and first["next"] is None
    assert first["last"] == LogLine.objects.get(run_id=run_id, line="step 2").pk
    quiet = api.get(url, after=first["last"]).json()  # nothing new: the same place to go on from
    assert quiet["lines"] == [] and quiet["last"] == first["last"] and quiet["next"] is None
    report_logs(run_id, token, "b2", ["step 3", "step 4", "step 5"])
    second = api.get(url, after=quiet["last"]).json()
    assert second["lines"] == ["step 3", "step 4", "step 5"] and second["total"] == 5 and second["next"] is None
    # The tail's `last` follows too: a client may open on the last lines, then poll for the new ones.
    tail = api.get(url, tail=2).json()
    assert tail["lines"] == ["step 4", "step 5"] and tail["last"] == second["last"]
    report_logs(run_id, token, "b3", ["step 6"])
    assert api.get(url, after=tail["last"]).json()["lines"] == ["step 6"]
    # A page short of the end: `last` is `next`.
    page = api.get(url, after=0, limit=2).json()
    assert page["lines"] == ["step 1", "step 2"] and page["next"] == page["last"] == first["last"]


def test_full_is_the_first_page_and_no_answer_holds_more_than_the_page_limits(api, run):
    # 16.6 MB in one answer for a 128k-line log: a page has at most LOGS_MAX_LINES lines and about LOGS_MAX_CHARS characters.
    LogLine.objects.bulk_create([LogLine(run=run, line=f"line {i}") for i in range(LOGS_MAX_LINES + 10)])
    body = api.get(f"/api/training-runs/{run.pk}/logs", full="true").json()
    assert len(body["lines"]) == LOGS_MAX_LINES and body["lines"][0] == "line 0" and body["total"] == LOGS_MAX_LINES + 10
    rest = api.get(f"/api/training-runs/{run.pk}/logs", after=body["next"]).json()
    assert rest["lines"] == [f"line {i}" for i in range(LOGS_MAX_LINES, LOGS_MAX_LINES + 10)] and rest["next"] is None
    assert len(api.get(f"/api/training-runs/{run.pk}/logs", tail=LOGS_MAX_LINES).json()["lines"]) == LOGS_MAX_LINES
    long = "y" * LOG_LINE_CHARS
    LogLine.objects.bulk_create([LogLine(run=run, line=long) for _ in range(LOGS_MAX_CHARS // LOG_LINE_CHARS + 50)])
    last = api.get(f"/api/training-runs/{run.pk}/logs", after=rest["next"] or body["next"], limit=LOGS_MAX_LINES).json()
    assert sum(map(len, last["lines"])) <= LOGS_MAX_CHARS and last["next"] is not None
    assert sum(map(len, api.get(f"/api/training-runs/{run.pk}/logs", tail=LOGS_MAX_LINES).json()["lines"])) <= LOGS_MAX_CHARS


@pytest.mark.parametrize("query, field", [({"tail": "0"}, "tail"), ({"tail": "x"}, "tail"), ({"full": "perhaps"}, "full"), ({"full": "true", "tail": "2"}, "tail"),
                                          ({"tail": str(LOGS_MAX_LINES + 1)}, "tail"), ({"after": "-1"}, "after"), ({"after": "x"}, "after"),
                                          ({"after": "0", "limit": "0"}, "limit"), ({"after": "0", "limit": str(LOGS_MAX_LINES + 1)}, "limit"),
                                          ({"limit": "10"}, "limit"), ({"after": "0", "tail": "5"}, "tail"), ({"after": "0", "full": "true"}, "full")])
def test_logs_with_bad_query_is_400(api, log_run, query, field):
    assert_error(api.get(f"/api/training-runs/{log_run.pk}/logs", **query), 400, field)


def test_logs_of_a_run_without_lines(api, run):
    assert untimed(api.get(f"/api/training-runs/{run.pk}/logs").json()) == {"lines": [], "total": 0, "next": None}


TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "ValueError: bad reward"]


def test_a_restart_keeps_the_failed_attempts_log_readable_by_attempt(api):
    from tests.conftest import sft_body

    run = TrainingRun.objects.get(pk=api.post("/api/training-runs", sft_body()).json()["id"])
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.FAILED, attempt=1)
    LogLine.objects.bulk_create([LogLine(run=run, attempt=1, line=line) for line in ["step 1", *TRACEBACK]])
    assert api.post(f"/api/training-runs/{run.pk}/start").status_code == 202
    assert list(LogLine.objects.filter(run=run, attempt=1).order_by("id").values_list("line", flat=True))[:4] == ["step 1", *TRACEBACK]
    # A worker claims the restart: attempt 2 reports.
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=2)
    LogLine.objects.bulk_create([LogLine(run=run, attempt=2, line=f"attempt 2 step {i}") for i in range(3)])

    current = api.get(f"/api/training-runs/{run.pk}/logs", full="true").json()
    assert untimed(current) == {"lines": [f"attempt 2 step {i}" for i in range(3)], "total": 3, "next": None}
    first = api.get(f"/api/training-runs/{run.pk}/logs", full="true", attempt=1).json()
    assert first["lines"][:4] == ["step 1", *TRACEBACK] and first["lines"][-1] == "[studio] status → queued: restarted" and first["total"] == 5
    assert untimed(api.get(f"/api/training-runs/{run.pk}/logs", tail=1, attempt=1).json()) == {"lines": ["[studio] status → queued: restarted"], "total": 5, "next": None}
    assert api.get(f"/api/training-runs/{run.pk}/logs", attempt=2).json()["lines"] == current["lines"]


@pytest.mark.parametrize("attempt", ["3", "0", "x"])
def test_logs_of_an_attempt_the_run_never_had_is_400_naming_attempt(api, run, attempt):
    TrainingRun.objects.filter(pk=run.pk).update(attempt=2)
    body = assert_error(api.get(f"/api/training-runs/{run.pk}/logs", attempt=attempt), 400, "attempt")
    if attempt == "3":
        assert "attempts 1 to 2" in body["errors"][0]["message"]


def test_logs_since_the_last_start_span_the_attempts_a_spot_interruption_retried_in(api, run):
    # START → attempt 1 failed; START again → attempt 2, interrupted and retried in attempt 3.
    TrainingRun.objects.filter(pk=run.pk).update(attempt=3, interruptions=1, status=Status.RUNNING)
    LogLine.objects.bulk_create([LogLine(run=run, attempt=a, line=f"attempt {a}") for a in (1, 2, 3)])
    assert untimed(api.get(f"/api/training-runs/{run.pk}/logs").json()) == {"lines": ["attempt 2", "attempt 3"], "total": 2, "next": None}
    assert untimed(api.get(f"/api/training-runs/{run.pk}/logs", attempt=2).json()) == {"lines": ["attempt 2"], "total": 1, "next": None}


def test_lines_from_before_the_first_start_read_with_attempt_one(api, run):
    LogLine.objects.create(run=run, attempt=0, line="[studio] START withdrawn by user before a worker claimed the run: it stays queued")
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1, status=Status.RUNNING)
    LogLine.objects.create(run=run, attempt=1, line="step 1")
    assert api.get(f"/api/training-runs/{run.pk}/logs").json()["total"] == 2
    assert api.get(f"/api/training-runs/{run.pk}/logs", attempt=1).json()["total"] == 2


# ---- rollouts ------------------------------------------------------------------------------------

@pytest.fixture
def rollout_run(run):
    Rollout.objects.bulk_create([
        Rollout(run=run, step=step, prompt=f"p{step}.{i}", completion=f"c{step}.{i}", reward=i / 2, advantage=None if i else 0.5, components={"fmt": 1.0})
        for step in (3, 1, 2) for i in range(2)
    ])
    return run


def test_rollouts_are_step_ordered_and_paginated(api, rollout_run):
    body = api.get(f"/api/training-runs/{rollout_run.pk}/rollouts").json()
    assert body["count"] == 6
    assert [r["step"] for r in body["items"]] == [1, 1, 2, 2, 3, 3]
    first = body["items"][0]
    assert first == {"step": 1, "prompt": "p1.0", "completion": "c1.0", "reward": 0.0, "advantage": 0.5, "components": {"fmt": 1.0}}
    page = api.get(f"/api/training-runs/{rollout_run.pk}/rollouts", limit=2, offset=2).json()
    assert [r["prompt"] for r in page["items"]] == ["p2.0", "p2.1"]


def test_rollouts_filter_by_step(api, rollout_run):
    body = api.get(f"/api/training-runs/{rollout_run.pk}/rollouts", step=2).json()
    assert [r["prompt"] for r in body["items"]] == ["p2.0", "p2.1"]


@pytest.mark.parametrize("step", ["-1", "two"])
def test_rollouts_with_bad_step_is_400(api, rollout_run, step):
    assert_error(api.get(f"/api/training-runs/{rollout_run.pk}/rollouts", step=step), 400, "step")


# ---- checkpoints ---------------------------------------------------------------------------------

def test_checkpoints_list_in_step_order(api, run):
    Checkpoint.objects.create(run=run, attempt=2, step=200, kind="final", path="/out/final")
    Checkpoint.objects.create(run=run, attempt=1, step=100, path="/out/checkpoint-100")
    body = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
    assert [(c["step"], c["kind"], c["attempt"], c["path"]) for c in body] == [(100, "checkpoint", 1, "/out/checkpoint-100"), (200, "final", 2, "/out/final")]
    assert all(c["created_at"] for c in body)


def test_checkpoints_carry_the_metrics_reported_at_their_step(api, run):
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=10.0 - s / 100) for s in range(1, 201)]
                                    + [MetricPoint(run=run, key="eval_loss", step=100, value=1.5)])
    for step in (100, 150, 250):
        Checkpoint.objects.create(run=run, attempt=1, step=step, path=f"/out/checkpoint-{step}")
    body = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
    assert [(c["step"], c["metrics"]) for c in body] == [(100, {"eval_loss": 1.5, "loss": 9.0}), (150, {"loss": 8.5}), (250, {})]


def test_checkpoint_metrics_are_one_query_however_many_checkpoints(api, run):
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key=key, step=s, value=float(s)) for s in range(1, 401) for key in ("loss", "grad_norm")])

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            body = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
        assert all(c["metrics"] == {"grad_norm": float(c["step"]), "loss": float(c["step"])} for c in body)
        return len(ctx.captured_queries)

    Checkpoint.objects.bulk_create([Checkpoint(run=run, attempt=1, step=s, path=f"/out/checkpoint-{s}") for s in (10, 20)])
    api.get(f"/api/training-runs/{run.pk}/checkpoints")  # the token's last_used_at write happens once a minute: not on the pinned calls
    few = count()
    Checkpoint.objects.bulk_create([Checkpoint(run=run, attempt=1, step=s, path=f"/out/checkpoint-{s}") for s in range(30, 400, 10)])
    assert count() == few


def test_checkpoints_of_an_earlier_start_have_no_metrics_and_a_spot_retrys_keep_theirs(api, run):
    # Attempt 1 failed; START again wiped its points, and attempt 2 reported its own at the same step.
    TrainingRun.objects.filter(pk=run.pk).update(attempt=2, interruptions=0)
    MetricPoint.objects.create(run=run, key="loss", step=100, value=2.0)
    Checkpoint.objects.create(run=run, attempt=1, step=100, path="/out/1/checkpoint-100")
    Checkpoint.objects.create(run=run, attempt=2, step=100, path="/out/2/checkpoint-100")
    body = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
    assert [(c["attempt"], c["metrics"]) for c in body] == [(1, {}), (2, {"loss": 2.0})]
    # Attempt 2 is instead a spot retry of attempt 1 (one START): attempt 1's step is of the same series.
    TrainingRun.objects.filter(pk=run.pk).update(interruptions=1)
    body = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
    assert [(c["attempt"], c["metrics"]) for c in body] == [(1, {"loss": 2.0}), (2, {"loss": 2.0})]


def test_the_checkpoints_tab_shows_each_steps_loss(api, run, users):
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1, status=Status.COMPLETED)
    MetricPoint.objects.create(run=run, key="loss", step=100, value=1.23456)
    Checkpoint.objects.create(run=run, attempt=1, step=100, path="/out/checkpoint-100")
    Checkpoint.objects.create(run=run, attempt=1, step=120, kind="final", path="/out/final")
    browser = Client()
    browser.force_login(users["viewer"])
    page = browser.get(f"/training/runs/{run.pk}/checkpoints/").content.decode()
    assert '<th scope="col">Loss</th>' in page
    assert 'data-testid="loss-checkpoint-100-attempt-1">1.2346</td>' in page and 'data-testid="loss-final-120-attempt-1">—</td>' in page


# ---- reads of another project's run -------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["", "/metrics", "/logs", "/rollouts", "/checkpoints"])
def test_reads_of_another_projects_run_are_404(api_as, run, suffix):
    MetricPoint.objects.create(run=run, key="loss", step=1, value=1.0)
    assert_error(api_as("outsider").get(f"/api/training-runs/{run.pk}{suffix}"), 404)


def test_cost_reads_the_same_in_every_response(api, project):
    """cost is the column's four decimals everywhere: create answered "0" where GET said "0.0000"."""
    from decimal import Decimal

    from tests.conftest import sft_body

    created = api.post("/api/training-runs", sft_body()).json()
    assert created["cost"] == "0.0000"
    TrainingRun.objects.filter(pk=created["id"]).update(cost=Decimal("1.23456789"))
    assert api.get(f"/api/training-runs/{created['id']}").json()["cost"] == "1.2346"
    assert api.get("/api/training-runs").json()["items"][0]["cost"] == "1.2346"
