"""Calls into a package's reward code during a GRPO run: a time limit on each call, rewards that are not
finite numbers, which step, row and rollout a failure happened at, what the code prints, and sys.exit."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.engine.conftest import IngestStub, ingest, make_spec, run_inprocess, tiny  # noqa: F401 - fixtures
from tests.environments.test_engine_envs import FAST, spec_of, write_package
from training.engine import environments
from training.engine.environments import PackageCallError, environment_for
from training.engine.packages import EnvironmentLoadError
from training.engine.reporter import Reporter

ROOT = Path(__file__).resolve().parents[2]


def package(score_body: str) -> str:
    """A package whose score() runs `score_body` (with row and completion in scope) over two rows."""
    body = "\n".join("        " + line for line in score_body.strip().splitlines())
    return f'''import sys
import time


class Env:
    def rows(self):
        return [{{"prompt": "What is 2+2?", "answer": "4"}}, {{"prompt": "What is 3+3?", "answer": "6"}}]

    def score(self, row, completion):
{body}


def load_environment(**kwargs):
    return Env()
'''


def grpo_spec(tiny: dict[str, str], tmp_path: Path, ingest: IngestStub, source: str, dataset: list[str] | None = None) -> dict:  # noqa: F811
    pkg = write_package(tmp_path / "pkg", source)
    return make_spec("grpo", tiny["student"], dataset or [], tmp_path / "out", {**FAST, "environment_id": "mine@main"}, ingest,
                     environment={"id": "mine@main", "path": str(pkg)})


def test_a_hung_score_fails_the_run_naming_the_call_step_row_and_rollout(tiny, ingest: IngestStub, tmp_path, monkeypatch):  # noqa: F811
    import verifiers.v1  # noqa: F401 - loading a package imports it (seconds, cold), within the load's 2 s here

    monkeypatch.setattr(environments, "CALL_LIMIT_S", 2.0, raising=False)
    # The first call hangs for a minute (without a limit the run would finish, late, and complete).
    spec = grpo_spec(tiny, tmp_path, ingest, package("if not hasattr(Env, 'hung'):\n    Env.hung = True\n    time.sleep(60)\nreturn 1.0"))
    started = time.monotonic()
    assert run_inprocess(spec) == 1
    assert time.monotonic() - started < 50
    message = ingest.scalars("error")[-1]["message"]
    assert message.startswith("environment mine@main: score() (step 1, prompt ")
    assert ", rollout 1 of 4) did not return within 2 s; fix the package" in message
    assert not ingest.series("reward")


def test_a_hung_load_environment_fails_the_load(tmp_path, monkeypatch):
    monkeypatch.setattr(environments, "CALL_LIMIT_S", 1.0, raising=False)
    pkg = write_package(tmp_path / "slow", "import time\n\nclass Env:\n    def score(self, row, completion):\n        return 1.0\n\n"
                                           "def load_environment(**kwargs):\n    time.sleep(60)\n    return Env()\n")
    started = time.monotonic()
    with pytest.raises(EnvironmentLoadError, match=r"^environment slow@main: loading the package did not finish within 1 s; "):
        environment_for(spec_of({"environment_id": "slow@main"}, {"path": str(pkg)}))
    assert time.monotonic() - started < 30


SWALLOWS_THE_ALARM = """
while True:  # as C code that retries through the signal would, or a bare except around a wait
    try:
        time.sleep(10_000)
    except BaseException:
        pass
"""


def test_a_call_that_ignores_the_time_limit_is_stopped_by_the_watchdog(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    # Through the CLI in its own process: the watchdog ends the process once the run's failure is reported.
    spec = grpo_spec(tiny, tmp_path, ingest, package(SWALLOWS_THE_ALARM))
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    launcher = ("import sys\nimport verifiers.v1\nfrom training.engine import environments\n"
                "environments.CALL_LIMIT_S = 1.0\nenvironments.STUCK_GRACE_S = 1.0\n"
                "from training.engine.__main__ import main\nsys.exit(main(['--spec', sys.argv[1]]))\n")
    try:
        done = subprocess.run([sys.executable, "-c", launcher, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the engine still runs minutes after its reward call ran past the time limit")
    assert done.returncode == 1, done.stderr[-2000:]
    assert ingest.scalars("status")[-1] == "failed"
    message = ingest.scalars("error")[-1]["message"]
    assert message.startswith("environment mine@main: score() (step 1, prompt ")
    assert "did not return within 1 s and ignored the time limit, so the run was stopped" in message


def reward_fn(source: str, tmp_path: Path):
    """The reward function GRPO hands TRL, over a loaded package, with a reporter that sends nowhere."""
    from training.engine.grpo import make_reward_fn

    pkg = write_package(tmp_path / "pkg", source)
    spec = spec_of({"environment_id": "mine@main"}, {"path": str(pkg)})
    reporter = Reporter(None, None, echo=False)
    env = environment_for(spec, reporter)
    return make_reward_fn(env, SimpleNamespace(spec=spec, reporter=reporter), 2, []), reporter


@pytest.mark.parametrize(("value", "shown"), [
    ("float('nan')", "nan"), ("float('inf')", "inf"), ("-float('inf')", "-inf"), ("1e39", "1e+39"),
    ('"0.5"', "str '0.5'"), ("None", "NoneType 'None'"), ("[1.0]", "list '[1.0]'"),
])
def test_a_reward_that_is_not_a_finite_number_fails_naming_the_component_row_and_value(tmp_path, value, shown):
    fn, _ = reward_fn(package(f'return {{"correct": 1.0, "bonus": {value} if completion == "b" else 0.0}}'), tmp_path)
    state = SimpleNamespace(global_step=4)
    with pytest.raises(PackageCallError) as info:
        fn(["p1", "p1"], ["a", "b"], answer=["4", "4"], _studio_row_number=[7, 7], trainer_state=state)
    assert str(info.value).startswith(f'environment mine@main: score() (step 5, prompt 7, rollout 2 of 2) returned component "bonus" is {shown}')
    # numpy scalars and bools are numbers; a number returned alone is the total
    fn, _ = reward_fn(package("import numpy\nreturn {'a': numpy.float32(0.25), 'b': numpy.bool_(True), 'c': True}"), tmp_path / "np")
    assert fn(["p"], ["a"], trainer_state=state) == [2.25]
    fn, _ = reward_fn(package("return 3"), tmp_path / "int")
    assert fn(["p"], ["a"], trainer_state=state) == [3.0]


def test_a_nan_reward_fails_the_grpo_run_with_a_sentence_not_an_attribute_error(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    spec = grpo_spec(tiny, tmp_path, ingest, package("return {'correct': 1.0, 'total': float('nan')}"))
    assert run_inprocess(spec) == 1
    message = ingest.scalars("error")[-1]["message"]
    # the package's own rows, cycled by prompts(): the number counts the run's prompts, not its rows
    assert message.startswith("environment mine@main: score() (step 1, prompt ")
    assert ', rollout 1 of 4) returned component "total" is nan: a reward must be a finite number within ±3.4e38' in message


def test_a_failing_score_names_the_step_and_the_dataset_row(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    rows = tmp_path / "questions.jsonl"
    rows.write_text('{"prompt": "What is 2+2?", "answer": "4"}\n{"prompt": "What is 3+3?", "answer": null}\n')
    spec = grpo_spec(tiny, tmp_path, ingest, package("return float(row['answer']) * 0 + 1.0"), [str(rows)])
    assert run_inprocess(spec) == 1
    message = ingest.scalars("error")[-1]["message"]
    assert message.startswith("environment mine@main: score() raised TypeError: float() argument must be")
    assert message.endswith(", row 2, rollout 1 of 4); fix the package and start the run again")
    assert " at __init__.py:10 (step " in message


def test_what_the_reward_code_prints_reaches_the_run_log_cut_per_step(tiny, ingest: IngestStub, tmp_path):  # noqa: F811
    spec = grpo_spec(tiny, tmp_path, ingest, package(
        'print(f"scoring {completion!r}")\nfor i in range(60):\n    print("detail", i, file=sys.stderr if i % 2 else sys.stdout)\nreturn 1.0'))
    assert run_inprocess(spec) == 0
    logs = ingest.collect("logs")
    assert sum(line.startswith("scoring ") for line in logs) == 3 * 4  # every rollout's first line, each step
    assert "detail 1" in logs and "detail 2" in logs  # stderr and stdout both
    # 4 rollouts x 61 lines = 244 a step, of which 200 are sent and 44 cut, said once a step
    assert sum(line.startswith(("scoring ", "detail ")) for line in logs) == 3 * 200
    for step in (1, 2, 3):
        assert (f"environment mine@main: 44 more lines it printed at step {step} were not sent "
                "(at most 200 lines and 20,000 characters a step; engine.log has them all)") in logs


def test_sys_exit_in_score_is_a_package_failure_naming_the_environment(tmp_path):
    pkg = write_package(tmp_path / "quits", package("sys.exit(3)"))
    env = environment_for(spec_of({"environment_id": "quits@main"}, {"path": str(pkg)}))
    with pytest.raises(PackageCallError, match=r"^environment quits@main: score\(\) raised SystemExit: 3 at __init__.py:10 "
                                               r"\(step 2, row 5, rollout 1 of 1\); fix the package"):
        env.score_rollouts([{"prompt": "p"}], ["a"], 2, [5])
    with pytest.raises(PackageCallError, match=r"^environment quits@main: score\(\) raised SystemExit: 3 at __init__.py:10; "):
        env.guarded("score()", env.score, {"prompt": "p"}, "a")


def test_what_a_package_prints_while_it_loads_reaches_the_run_log_cut_as_step_0(tmp_path, monkeypatch):
    monkeypatch.setattr(environments, "OUTPUT_LINES_PER_STEP", 20)
    pkg = write_package(tmp_path / "pkg", 'import sys\n\nprint("importing")\n\n\nclass Env:\n    def score(self, row, completion):\n        return 1.0\n\n\n'
                                          'def load_environment(**kwargs):\n    for i in range(30):\n'
                                          '        print("loaded", i, file=sys.stderr if i % 2 else sys.stdout)\n    return Env()\n')
    reporter = Reporter(None, None, echo=False)
    environment_for(spec_of({"environment_id": "mine@main"}, {"path": str(pkg)}), reporter)
    logs = list(reporter.log_tail)
    assert logs[1:21] == ["importing"] + [f"loaded {i}" for i in range(19)]  # at import, in load_environment, stdout and stderr
    assert logs[21:] == ["environment mine@main: 11 more lines it printed at step 0 were not sent "
                         "(at most 20 lines and 20,000 characters a step; engine.log has them all)"]


def test_a_failing_load_environment_names_the_pinned_commit_and_the_line(tmp_path):
    pkg = write_package(tmp_path / "pkg", "import sys\n\n\ndef load_environment(**kwargs):\n    sys.exit(2)\n")
    block = {"path": str(pkg), "repo": "ann/bad-env", "commit": "0123456789abcdef0123"}
    with pytest.raises(EnvironmentLoadError, match=r"^environment bad-env@0123456789ab: loading the package failed: SystemExit: 2 "
                                                   r"in load_environment\(\) at __init__.py:5; fix the package and start the run again$"):
        environment_for(spec_of({"environment_id": "bad-env@main"}, block))
    pkg = write_package(tmp_path / "imp", "import sys\n\nraise ValueError('no key')\n")
    with pytest.raises(EnvironmentLoadError, match=r"^environment bad-env@0123456789ab: loading the package failed: ValueError: no key "
                                                   r"at __init__.py:3; fix the package"):
        environment_for(spec_of({"environment_id": "bad-env@main"}, {**block, "path": str(pkg)}))


def test_what_prompts_prints_counts_as_load_time_output_not_toward_step_1s(tiny, ingest: IngestStub, tmp_path, monkeypatch):  # noqa: F811
    # QA: 150 lines printed by prompts() used up most of step 1's 200, and score()'s lines at step 1 were cut.
    monkeypatch.setattr(environments, "OUTPUT_LINES_PER_STEP", 50)
    source = package('print("scored line")\nreturn 1.0').replace(
        "    def rows(self):\n", "    def prompts(self, n, seed):\n        for i in range(60):\n            print('preparing', i)\n"
                                "        return [{'prompt': 'What is 2+2?', 'answer': '4'}] * n\n\n    def rows(self):\n")
    spec = grpo_spec(tiny, tmp_path, ingest, source)
    assert run_inprocess(spec) == 0
    logs = ingest.collect("logs")
    assert sum(line.startswith("preparing ") for line in logs) == 50
    assert ("environment mine@main: 10 more lines it printed at step 0 were not sent "
            "(at most 50 lines and 20,000 characters a step; engine.log has them all)") in logs
    assert sum(line == "scored line" for line in logs) == 3 * 4  # each step's 4 rollouts, step 1's too
    assert not any("printed at step 1" in line for line in logs), [line for line in logs if "printed at step" in line]
