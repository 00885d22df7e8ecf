"""The engine side: staged packages (load_environment and verifiers Taskset), tool calls within a
rollout, a package that fails to load, and RULER against a local OpenAI-compatible judge."""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.engine.conftest import IngestStub, ingest, make_spec, run_inprocess, tiny  # noqa: F401 - fixtures
from tests.environments.conftest import CATALOGUE
from training.engine import ruler
from training.engine.environments import PackageCallError, environment_for
from training.engine.packages import EnvironmentLoadError, TasksetEnvironment, load_package
from training.engine.spec import SEED_DEFAULT

FAST = {"max_steps": 3, "learning_rate": 1e-2, "rollouts_per_prompt": 4, "max_response_length": 8, "rollout_log_steps": 1}


def spec_of(config: dict, environment: dict | None = None, output_dir: str = "/tmp/x") -> Any:
    return SimpleNamespace(cfg=lambda k, d=None: config.get(k, d) if config.get(k) is not None else d,
                           raw={"environment": environment} if environment else {}, output_dir=output_dir, datasets=config.get("datasets") or [],
                           seed=int(config.get("seed", SEED_DEFAULT)))


def test_grpo_reports_the_system_prompt_it_used_the_environments_own_unless_the_config_sets_one():
    from training.engine.grpo import _prompt_rows
    from training.engine.reporter import Reporter

    for config, expected in (({}, None), ({"system_prompt": "Be brief."}, "Be brief.")):
        spec = spec_of({"environment_id": "builtin/gsm-maths@main", "max_steps": 1, **config})
        spec.datasets = []
        env = environment_for(spec)
        reporter = Reporter(None, None, echo=False)
        rows = _prompt_rows(SimpleNamespace(spec=spec, reporter=reporter), env)
        used = expected or env.system_prompt
        assert reporter._take()["system_prompt"] == used and rows[0]["prompt"][0] == {"role": "system", "content": used}


def write_package(root: Path, init: str, **files: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text(init)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_catalogue_ids_resolve_in_the_engine_without_studio():
    env = environment_for(spec_of({"environment_id": "builtin/gsm-maths@main"}))
    assert env.id == "builtin/gsm-maths@main" and env.system_prompt
    assert env.score({"prompt": "q", "answer": "3"}, "#### 3")["total"] == pytest.approx(1.0)
    staged = environment_for(spec_of({"environment_id": "mine@main"}, {"path": str(CATALOGUE / "science_qa")}))
    assert "mentions" in staged.score(staged.prompts(1, 0)[0], "Answer: x")
    with pytest.raises(EnvironmentLoadError, match="not staged"):
        environment_for(spec_of({"environment_id": "mine@main"}))


def test_a_verifiers_taskset_package_is_adapted(tmp_path):
    pkg = write_package(tmp_path / "echo", '''
import verifiers.v1 as vf


class EchoData(vf.TaskData):
    answer: str = ""


class EchoTask(vf.Task[EchoData]):
    @vf.reward(weight=0.75)
    async def exact(self, task, trace) -> float:
        return 1.0 if trace.last_reply.strip() == task.answer else 0.0

    @vf.reward(weight=0.25)
    async def short(self, task, trace) -> float:
        return 1.0 if len(trace.last_reply) < 5 else 0.0


class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        for i in range(3):
            yield EchoTask(EchoData(prompt=f"Say {i}", answer=str(i)))
''')
    env = load_package(pkg, "echo@main")
    assert isinstance(env, TasksetEnvironment)
    rows = env.prompts(6, seed=0)
    assert sorted(r["prompt"] for r in rows) == ["Say 0", "Say 0", "Say 1", "Say 1", "Say 2", "Say 2"]
    row = next(r for r in rows if r["prompt"] == "Say 1")
    assert env.score(row, "1") == {"exact": 1.0, "short": 1.0, "total": 1.0}
    assert env.score(row, "two and more") == {"exact": 0.0, "short": 0.0, "total": 0.0}
    assert env.score(row, "2")["total"] == pytest.approx(0.25)


def test_a_raising_load_environment_is_an_environment_load_error_with_its_cause(tmp_path):
    pkg = write_package(tmp_path / "boom", "def load_environment(**kwargs):\n    raise RuntimeError('dataset shard missing')\n")
    with pytest.raises(EnvironmentLoadError) as info:
        environment_for(spec_of({"environment_id": "boom@main"}, {"path": str(pkg)}))
    assert "dataset shard missing" in str(info.value) and isinstance(info.value.__cause__, RuntimeError)


def test_grpo_with_a_staged_catalogue_package_reports_its_components(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    spec = make_spec("grpo", tiny["student"], [], tmp_path / "out", {**FAST, "environment_id": "gsm@main"}, ingest,
                     environment={"id": "gsm@main", "path": str(CATALOGUE / "gsm_maths")})
    assert run_inprocess(spec) == 0
    assert len(ingest.series("reward")) == 3
    for key in ("rewards/correct", "rewards/close", "rewards/format"):
        assert len(ingest.series(key)) == 3, key
    rollouts = ingest.collect("rollouts")
    assert len(rollouts) == 3 * 4 and set(rollouts[0]["components"]) == {"correct", "close", "format"}


def test_grpo_tool_calls_continue_the_rollout(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    # A tool whose stop text the random tiny model emits all the time, so the loop really runs.
    pkg = write_package(tmp_path / "echo_tool", '''
class Env:
    tool_stop = "e"
    max_tool_calls = 2
    system_prompt = None

    def rows(self):
        return [{"prompt": "Say something", "answer": "x"}]

    def call_tool(self, text):
        return " [TOOL] "

    def score(self, row, completion):
        return {"tool_calls": completion.count("[TOOL]") / 2}


def load_environment(**kwargs):
    return Env()
''')
    spec = make_spec("grpo", tiny["student"], [], tmp_path / "out", {**FAST, "max_response_length": 24, "environment_id": "t@main"}, ingest,
                     environment={"id": "t@main", "path": str(pkg)})
    assert run_inprocess(spec) == 0
    rollouts = ingest.collect("rollouts")
    counts = [r["completion"].count("[TOOL]") for r in rollouts]
    assert max(counts) >= 1 and max(counts) <= 2, counts  # the tool ran, and never more than max_tool_calls times
    assert all(r["components"]["tool_calls"] == c / 2 for r, c in zip(rollouts, counts, strict=True))


# ---- RULER ---------------------------------------------------------------------------------------

class JudgeServer:
    """A tiny OpenAI-compatible /v1/chat/completions: scores longer responses higher (relative)."""

    def __init__(self, fail: int = 0, error_message: str = "judge overloaded") -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_left = fail
        self.error_message = error_message
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": None})
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "served-judge", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                if outer.fail_left:
                    outer.fail_left -= 1
                    self._send(503, {"error": {"message": outer.error_message, "type": "server_error"}})
                    return
                user = body["messages"][-1]["content"]
                responses = user.split('<response id="')[1:]
                lengths = [len(r.split(">", 1)[1].split("</response>")[0].strip()) for r in responses]
                top = max(lengths) or 1
                scores = [{"id": i + 1, "explanation": "longer is better here", "score": n / top} for i, n in enumerate(lengths)]
                self._send(200, {"id": "x", "object": "chat.completion", "model": body["model"],
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps({"scores": scores})}, "finish_reason": "stop"}]})

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge():
    server = JudgeServer()
    yield server
    server.close()


KEY = "sk-test-DO-NOT-LEAK-4f9a1c"


def ruler_config(tmp_path: Path, judge_url: str) -> dict:
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": p}) for p in ("Write a kind greeting.", "Describe the sea.", "Thank a colleague.")) + "\n")
    return {**FAST, "rl_mode": "ruler", "ruler_task_args": {"dataset": str(data), "system_prompt": "Be warm and detailed."},
            "judge": {"mode": "external", "endpoint": judge_url, "model": "judge-1", "api_key_secret": "judge-key"}}


def test_the_judge_parses_scores_and_retries_then_fails_with_its_message(judge, monkeypatch):
    monkeypatch.setattr(ruler, "BACKOFF_S", 0.01)
    client = ruler.RulerJudge(judge.url, "judge-1", KEY, log=lambda line: None)
    assert client.score_group("be long", "p", ["a", "abcd"]) == [0.25, 1.0]
    assert judge.requests[-1]["auth"] == f"Bearer {KEY}" and judge.requests[-1]["path"] == "/v1/chat/completions"
    judge.fail_left = 2
    assert client.score_group("be long", "p", ["ab", "abcd"]) == [0.5, 1.0]  # two failures, then a success
    judge.fail_left, judge.error_message = 99, f"model judge-1 is overloaded (key {KEY})"
    with pytest.raises(ruler.JudgeError) as info:
        client.score_group("c", "p", ["a"])
    assert "model judge-1 is overloaded" in str(info.value) and "HTTP 503" in str(info.value) and KEY not in str(info.value)
    assert ruler.RulerJudge.parse_scores('```json\n{"scores": [{"id": 1, "score": 2}]}\n```', 1) == [1.0]
    with pytest.raises(ruler.JudgeError, match="no score for response"):
        ruler.RulerJudge.parse_scores('{"scores": [{"id": 1, "score": 0.5}]}', 2)


def test_grpo_ruler_scores_each_group_with_the_judge(tiny, ingest: IngestStub, judge, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STUDIO_JUDGE_API_KEY", KEY)
    spec = make_spec("grpo", tiny["student"], [], tmp_path / "out", ruler_config(tmp_path, judge.url), ingest)
    assert run_inprocess(spec) == 0
    assert len(judge.requests) == 3  # one request per step: the step's group of 4 rollouts together
    assert all(r["body"]["messages"][-1]["content"].count("<response id=") == 4 for r in judge.requests)
    assert "Be warm and detailed." in judge.requests[0]["body"]["messages"][-1]["content"]
    rollouts = ingest.collect("rollouts")
    assert len(rollouts) == 12 and all(set(r["components"]) == {"judge"} for r in rollouts)
    assert all(max(r["reward"] for r in rollouts if r["step"] == s) == 1.0 for s in (1, 2, 3))  # relative scores
    assert len(ingest.series("rewards/judge")) == 3
    assert KEY not in json.dumps(ingest.batches)


def test_grpo_ruler_fails_with_the_judges_message_after_retries(tiny, ingest: IngestStub, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STUDIO_JUDGE_API_KEY", KEY)
    monkeypatch.setattr(ruler, "BACKOFF_S", 0.01)
    server = JudgeServer(fail=100, error_message="rate limit for judge-1 exceeded")
    try:
        spec = make_spec("grpo", tiny["student"], [], tmp_path / "out", ruler_config(tmp_path, server.url), ingest)
        assert run_inprocess(spec) == 1
    finally:
        server.close()
    assert len(server.requests) == ruler.ATTEMPTS
    error = ingest.scalars("error")[-1]
    assert error["code"] == "training_error" and "rate limit for judge-1 exceeded" in error["message"]
    assert not ingest.series("reward")
    assert KEY not in json.dumps(ingest.batches)


def test_a_catalogue_package_travels_inline_to_remote_jobs(tmp_path):
    from environments.services import catalogue_entry

    files = {p: b.decode() for p, b in catalogue_entry("calculator").files().items()}
    env = environment_for(spec_of({"environment_id": "builtin/calculator@main"}, {"id": "builtin/calculator@main", "files": files}, str(tmp_path)))
    assert (tmp_path / "environment" / "data.jsonl").is_file() and env.tool_stop == "</calc>"
    with pytest.raises(EnvironmentLoadError, match="leaves the package"):
        environment_for(spec_of({"environment_id": "x@main"}, {"files": {"../evil.py": ""}}, str(tmp_path / "2")))


def test_an_unset_judge_model_is_the_one_the_endpoint_serves(tiny, ingest: IngestStub, judge, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STUDIO_JUDGE_API_KEY", KEY)
    config = ruler_config(tmp_path, judge.url)
    config["judge"].pop("model")
    config["max_steps"] = 1
    assert run_inprocess(make_spec("grpo", tiny["student"], [], tmp_path / "out", config, ingest)) == 0
    assert judge.requests[0]["path"] == "/v1/models" and judge.requests[0]["auth"] == f"Bearer {KEY}"
    assert judge.requests[1]["body"]["model"] == "served-judge"
    assert any("using 'served-judge'" in line for line in ingest.collect("logs"))


def test_scoring_works_inside_a_running_event_loop():
    """A host that already runs an event loop in this thread (Playwright's sync API does) must not
    break the verifiers adapter's scoring."""
    from training.engine.packages import run_coroutine

    async def answer() -> int:
        return 42

    async def host() -> int:
        return run_coroutine(answer())

    # host() calls run_coroutine while its own loop runs: the helper-thread path, whether or not
    # this thread already had a loop of its own (it has one after the Playwright tests).
    assert run_coroutine(host()) == 42
    assert run_coroutine(answer()) == 42


def test_grpo_refuses_a_dataset_without_the_columns_its_environment_scores_against(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    rows = tmp_path / "questions.jsonl"
    rows.write_text('{"prompt": "What is 2+2?", "answer": "4"}\n{"prompt": "What is 3+3?", "answer": ""}\n')
    spec = make_spec("grpo", tiny["student"], [str(rows)], tmp_path / "out", {**FAST, "environment_id": "gsm@main"}, ingest,
                     environment={"id": "gsm@main", "path": str(CATALOGUE / "gsm_maths")})
    assert run_inprocess(spec) == 2  # a spec error
    assert 'row 2: "answer" is empty, and gsm@main scores each completion against it' in ingest.scalars("error")[-1]["message"]
    assert not ingest.series("reward")
    rows.write_text('{"prompt": "What is 2+2?", "solution": "4"}\n')
    assert run_inprocess(spec) == 2  # a spec error
    assert 'has no "answer" column (its columns: prompt, solution)' in ingest.scalars("error")[-1]["message"]


BROKEN_SCORE = '''
class Env:
    def rows(self):
        return [{"prompt": "What is 2+2?", "answer": "4"}]

    def score(self, row, completion):
        return {"correct": float(completion.strip() == row["answer"]), "bogus": row["missing_column"] / 0}


def load_environment(**kwargs):
    return Env()
'''


def test_a_failing_score_names_the_environment_commit_callback_and_package_line(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    # The staged copy lies in the run directory; the message names the package's own file and line.
    pkg = write_package(tmp_path / "out" / "environment", BROKEN_SCORE)
    line = BROKEN_SCORE.splitlines().index('        return {"correct": float(completion.strip() == row["answer"]), "bogus": row["missing_column"] / 0}') + 1
    commit = "0123456789abcdef0123456789abcdef01234567"
    spec = make_spec("grpo", tiny["student"], [], tmp_path / "out", {**FAST, "environment_id": "my-gsm@main"}, ingest,
                     environment={"id": "my-gsm@main", "path": str(pkg), "repo": "my-gsm", "commit": commit})
    assert run_inprocess(spec) == 1
    assert re.fullmatch(  # the prompt is whichever of the environment's prompts step 1 drew
        re.escape(f"environment my-gsm@{commit[:12]}: score() raised KeyError: 'missing_column' at __init__.py:{line} (step 1, prompt ")
        + r"\d+" + re.escape(", rollout 1 of 4); fix the package and start the run again"), ingest.scalars("error")[-1]["message"])
    assert not ingest.series("reward")


def test_a_failing_helper_or_tool_is_located_in_its_own_module(tmp_path):
    pkg = write_package(tmp_path / "pkg", '''
from .rules import check


class Env:
    tool_stop = "</calc>"

    def rows(self):
        return [{"prompt": "p"}]

    def call_tool(self, text):
        return check(text)

    def score(self, row, completion):
        return check(completion)


def load_environment(**kwargs):
    return Env()
''', **{"rules.py": "def check(text):\n    return int(text)\n"})
    env = environment_for(spec_of({"environment_id": "helper@main"}, {"path": str(pkg)}))
    with pytest.raises(PackageCallError, match=r"^environment helper@main: score\(\) raised ValueError: .* in check\(\) at rules.py:2; "):
        env.guarded("score()", env.score_group, [{"prompt": "p"}], ["seven"])
    with pytest.raises(PackageCallError, match=r"^environment helper@main: call_tool\(\) raised ValueError: .* in check\(\) at rules.py:2; "):
        env.guarded("call_tool()", env.call_tool, "x</calc>")
