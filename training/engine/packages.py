"""Loading a staged environment package from a directory and wrapping it into the `Environment` interface.

Two package contracts are accepted (seed 001 + verifiers 0.4):

- **load_environment package**: ``__init__.py`` exposes ``load_environment(**kwargs)``; the engine calls
  it with the package's ``CONFIG`` (from ``config.py`` or ``CONFIG`` in ``__init__``). What it returns may
  be an `Environment`, a verifiers v1 ``Taskset``, or any object with ``score(row, completion)`` (a dict
  of components, with or without ``total``, or a float) and rows from ``prompts(n, seed)``, ``rows()``
  or a ``dataset`` attribute. Optional: ``system_prompt``; a tool (``tool_stop``, ``call_tool(text)``,
  ``max_tool_calls``) that the rollout calls and continues after.
- **verifiers v1 Taskset package**: the package exports one ``vf.Taskset`` subclass; its tasks are the
  prompts and scoring builds a ``vf.Trace`` with the completion and awaits ``task.score(trace)``.

Any failure here is an `EnvironmentLoadError` raised before the model is loaded, so the run fails
before its first step, with the package's own traceback chained into the log.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import random
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from .environments import Environment, PackageError, reward_value

# CONFIG keys that describe the package (the catalogue and the Environments page show them), not arguments.
CONFIG_METADATA = ("name", "description")


class EnvironmentLoadError(PackageError):
    """The environment package is missing or could not be loaded (the cause is chained)."""


def package_root(directory: Path) -> Path:
    """The directory holding the package's ``__init__.py``: the staged root, or its one sub-package."""
    directory = Path(directory)
    if (directory / "__init__.py").is_file():
        return directory
    subs = [p for p in sorted(directory.iterdir()) if p.is_dir() and (p / "__init__.py").is_file()] if directory.is_dir() else []
    if len(subs) == 1:
        return subs[0]
    raise EnvironmentLoadError(f"{directory}: no __init__.py at the root (and not exactly one sub-package): an environment is a Python package")


def import_package(directory: Path) -> Any:
    root = package_root(directory)
    name = f"studio_env_{uuid.uuid4().hex[:12]}"
    spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
    if spec is None or spec.loader is None:
        raise EnvironmentLoadError(f"{root}: cannot import the package")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if str(root) not in sys.path:
        sys.path.append(str(root))  # `import helpers` of the package's own modules works as well as `from . import`
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def package_config(module: Any) -> dict[str, Any]:
    """The package's CONFIG: the module's own once __init__.py ran (defined there, or imported from one of
    its modules), else its config.py's. The Studio shows, checks and edits CONFIG where this rule finds
    it (environments.services.config_site), so a saved CONFIG is the one the package's code reads."""
    config = getattr(module, "CONFIG", None)
    if config is None:
        try:
            sub = importlib.import_module(f"{module.__name__}.config")
            config = getattr(sub, "CONFIG", None)
        except ModuleNotFoundError:
            config = None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise EnvironmentLoadError(f"CONFIG must be a dict, got {type(config).__name__}")
    return dict(config)


JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false", type(None): "null"}


def jsonl_problem(fh: BinaryIO, max_rows: int | None = None, max_row_bytes: int | None = None) -> tuple[int, str] | None:
    """The first line of the JSON Lines file `fh` that a loader reading it as the catalogue's do (each
    non-blank line `json.loads` into a row object) fails on, as (line number, what is wrong); None
    when every row read is an object. At most `max_rows` rows are read, and a line over
    `max_row_bytes` is reported without being held whole (the Studio's limits; the engine reads all)."""
    rows = 0
    for number in itertools.count(1):
        raw = fh.readline(max_row_bytes + 1) if max_row_bytes is not None else fh.readline()
        if not raw:
            return None
        if max_row_bytes is not None and len(raw.rstrip(b"\r\n")) > max_row_bytes:
            return number, f"over the {max_row_bytes:,} bytes a row may have"
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            return number, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError as exc:
            return number, f"not JSON ({getattr(exc, 'msg', exc)}, column {getattr(exc, 'colno', 1)})"
        if not isinstance(row, dict):
            return number, f"{JSON_KINDS.get(type(row), 'a value')}, not a row object ({{...}})"
        rows += 1
        if max_rows is not None and rows >= max_rows:
            return None
    return None


def check_jsonl_files(module: Any, config: dict[str, Any], root: Path, environment_id: str) -> None:
    """Read each CONFIG key the package declares as naming a JSON Lines file (JSONL_FILES in its
    __init__.py) before load_environment does: a file that is not one (data_file: /etc/passwd) failed
    the run with a JSONDecodeError naming neither the key, the file nor the line."""
    declared = getattr(module, "JSONL_FILES", ())
    for key in declared if isinstance(declared, (list, tuple)) else ():
        value = config.get(key)
        if not isinstance(value, str):
            continue
        path = Path(value) if Path(value).is_absolute() else root / value
        try:
            with path.open("rb") as fh:
                problem = jsonl_problem(fh)
        except OSError as exc:
            raise EnvironmentLoadError(f"environment {environment_id}: CONFIG.{key}: cannot read {value} ({exc.strerror or exc}): "
                                       f"set {key} to a JSON Lines file of the package, or put the file back") from exc
        if problem is not None:
            line, what = problem
            raise EnvironmentLoadError(f"environment {environment_id}: CONFIG.{key}: {value} line {line} is {what}, and load_environment reads "
                                       f"{key} as JSON Lines (one JSON object a line): set {key} to such a file, or fix that line")


def _taskset_classes(module: Any) -> list[type]:
    try:
        import verifiers.v1 as vf
    except ImportError:  # pragma: no cover - verifiers ships in the trainer image
        return []
    return [
        obj for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, vf.Taskset) and obj is not vf.Taskset and not getattr(obj, "__abstractmethods__", None)
    ]


def load_package(directory: Path | str, environment_id: str = "", overrides: dict[str, Any] | None = None) -> Environment:
    """Import the package in `directory` and return it as an `Environment`."""
    directory = Path(directory)
    if not directory.exists():
        raise EnvironmentLoadError(f"environment {environment_id or directory}: the staged package {directory} does not exist")
    module = import_package(directory)
    config = {**package_config(module), **(overrides or {})}
    factory = getattr(module, "load_environment", None)
    if callable(factory):
        check_jsonl_files(module, config, package_root(directory), environment_id)
        kwargs = {k: v for k, v in config.items() if k not in CONFIG_METADATA}
        try:
            obj = factory(**kwargs)
        except TypeError as exc:
            if "unexpected keyword" not in str(exc):
                raise
            obj = factory()  # a load_environment that takes no CONFIG keys
    else:
        classes = _taskset_classes(module)
        if len(classes) != 1:
            raise EnvironmentLoadError(
                f"environment {environment_id}: the package has no module-level load_environment(**kwargs) "
                f"and {'no' if not classes else 'more than one'} verifiers Taskset subclass"
            )
        obj = _instantiate_taskset(classes[0])
    env = wrap(obj, environment_id)
    env.config = config
    env.package_dir = package_root(directory)
    keys = getattr(module, "ROW_KEYS", ())
    env.row_keys = tuple(k for k in keys if isinstance(k, str)) if isinstance(keys, (list, tuple)) else ()
    return env


def _instantiate_taskset(cls: type) -> Any:
    import verifiers.v1 as vf
    from verifiers.v1.utils.generic import concrete_type

    config_cls = concrete_type(cls, vf.TasksetConfig) or vf.TasksetConfig
    return cls(config_cls())


def wrap(obj: Any, environment_id: str) -> Environment:
    if isinstance(obj, Environment):
        obj.id = obj.id or environment_id
        return obj
    try:
        import verifiers.v1 as vf

        if isinstance(obj, vf.Taskset):
            return TasksetEnvironment(obj, environment_id)
    except ImportError:  # pragma: no cover
        pass
    if not callable(getattr(obj, "score", None)):
        raise EnvironmentLoadError(
            f"environment {environment_id}: load_environment returned {type(obj).__name__}, which has no score(row, completion) "
            "and is not a verifiers Taskset"
        )
    return ObjectEnvironment(obj, environment_id)


def _total(parts: Any) -> dict[str, float]:
    """score()'s result as components with a ``total``; each must be a finite number (`reward_value` says
    which one is not, and Environment.guarded which row and rollout)."""
    if not isinstance(parts, dict):
        return {"total": reward_value("total", parts)}
    out = {str(k): reward_value(str(k), v) for k, v in parts.items()}
    if "total" not in out:
        out["total"] = reward_value("total", sum(out.values()))
    return out


def _jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    # Rows become dataset columns: keep scalars, JSON-encode the rest so every row has the same types.
    return {k: (v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v)) for k, v in row.items()}


class ObjectEnvironment(Environment):
    """A duck-typed environment object returned by a package's load_environment."""

    def __init__(self, obj: Any, environment_id: str) -> None:
        self.obj = obj
        self.id = environment_id
        self.system_prompt = getattr(obj, "system_prompt", None)
        if callable(getattr(obj, "call_tool", None)) and getattr(obj, "tool_stop", None):
            self.tool_stop = obj.tool_stop
            self.max_tool_calls = int(getattr(obj, "max_tool_calls", 3))
            self.call_tool = obj.call_tool  # type: ignore[method-assign]

    def _all_rows(self) -> list[dict[str, Any]]:
        if callable(getattr(self.obj, "rows", None)):
            rows = list(self.obj.rows())
        elif getattr(self.obj, "dataset", None) is not None:
            rows = [dict(r) for r in self.obj.dataset]
        else:
            raise EnvironmentLoadError(f"environment {self.id}: no prompts(n, seed), rows() or dataset to take prompts from")
        if not rows:
            raise EnvironmentLoadError(f"environment {self.id}: its dataset is empty")
        return rows

    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        if callable(getattr(self.obj, "prompts", None)):
            rows = list(self.obj.prompts(n, seed))
        else:
            base, rng, rows = self._all_rows(), random.Random(seed), []
            while len(rows) < n:
                batch = list(base)
                rng.shuffle(batch)
                rows += batch
            rows = rows[:n]
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), (str, list)):
                raise EnvironmentLoadError(f"environment {self.id}: row {i} has no prompt")
        return [_jsonable_row(r) for r in rows]

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        return _total(self.obj.score(row, completion))


class TasksetEnvironment(Environment):
    """A verifiers v1 Taskset: prompts are its tasks; scoring runs the task's @vf.reward methods on a Trace."""

    def __init__(self, taskset: Any, environment_id: str) -> None:
        self.taskset = taskset
        self.id = environment_id
        self.tasks = list(taskset.take(10000)) if not taskset.bounded else list(taskset)
        if not self.tasks:
            raise EnvironmentLoadError(f"environment {environment_id}: the Taskset yielded no tasks")
        prompts = {t.data.system_prompt for t in self.tasks}
        self.system_prompt = prompts.pop() if len(prompts) == 1 else None

    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        order: list[int] = []
        while len(order) < n:
            batch = list(range(len(self.tasks)))
            rng.shuffle(batch)
            order += batch
        return [{"prompt": self.tasks[i].data.prompt_text, "task_index": i} for i in order[:n]]

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        from verifiers.v1 import AgentConfig
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage

        task = self.tasks[int(row["task_index"])]
        trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                      agent=AgentInfo(config=AgentConfig(), name="studio", trainable=False))
        messages = ([SystemMessage(content=task.data.system_prompt)] if task.data.system_prompt else []) + [UserMessage(content=task.data.prompt_text)]
        for i, message in enumerate(messages):
            trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=message))
        trace.nodes.append(MessageNode(parent=len(messages) - 1, message=AssistantMessage(content=completion), sampled=True))
        run_coroutine(task.score(trace))
        parts = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
        parts["total"] = float(trace.reward)
        return parts


def run_coroutine(coro: Any) -> Any:
    """Run `coro` to completion from synchronous code. When this thread already runs an event loop
    (a host process that embeds the engine, a notebook), asyncio.run refuses, so the coroutine gets
    a loop of its own on a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
