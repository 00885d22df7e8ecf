"""RL environments: the curated catalogue, forking it into a project, static package checks before a
run starts, and staging a run's environment for the engine.

- An environment is a Python package whose ``__init__.py`` exposes ``load_environment(**kwargs)`` (or a
  verifiers v1 ``Taskset`` subclass), with its arguments in ``CONFIG`` (``config.py``, or wherever
  ``__init__.py`` defines it: ``config_site``).
- ``builtin/<name>@<ref>`` names a catalogue package (environments/catalogue/) or the engine's
  ``builtin/arith``; ``[project/]<repo>@<ref>`` names a Data Hub repo of type environment.
- The web process never imports a package: checks parse it with ``ast`` (``static_findings``).
"""
from __future__ import annotations

import ast
import io
import logging
import os
import pprint
import shutil
import sys
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from datahub.datasets import RowNeeds
from environments.declarations import (
    DECLARATIONS,
    assignment,
    code,
    config_key_finding,
    declaration_findings,
    declared_config_findings,
    jsonl_files,
    with_declarations,
)
from studio import audit
from studio.errors import BadRequest, Finding, NotFound
from studio.models import AuditEvent
from training.engine.packages import CONFIG_METADATA, jsonl_problem
from training.refs import inside_local_roots, studio_data_problem

log = logging.getLogger(__name__)
CATALOGUE_DIR = Path(__file__).resolve().parent / "catalogue"
ENGINE_BUILTINS = {"builtin/arith": "Two-number addition with a dense per-digit reward (ships with the engine)."}
FIELD = "config.environment_id"
MAIN_REF = "main"  # the one version of a built-in environment (builtin_ref_findings)
CONFIG_FILE = "config.py"
# What a CONFIG file path inside the Studio's own data (training.refs.studio_data) should be instead.
FILE_INSTEAD = "push the file to the environment's repo and name it by its path there"
SKIP_PARTS = {"__pycache__", ".git"}


# ---- the catalogue -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CatalogueEntry:
    name: str  # "gsm-maths"
    directory: Path

    @property
    def environment_id(self) -> str:
        return f"builtin/{self.name}@{MAIN_REF}"

    def files(self) -> dict[str, bytes]:
        return package_files_from_dir(self.directory)

    def config(self) -> dict[str, Any]:
        return read_config(self.files()) or {}


def package_files_from_dir(directory: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_file() and not (set(rel.parts) & SKIP_PARTS) and path.suffix != ".pyc":
            out[rel.as_posix()] = path.read_bytes()
    return out


def catalogue() -> list[CatalogueEntry]:
    return [CatalogueEntry(p.parent.name.replace("_", "-"), p.parent) for p in sorted(CATALOGUE_DIR.glob("*/__init__.py"))]


def catalogue_entry(name: str) -> CatalogueEntry | None:
    name = name.split("@", 1)[0].removeprefix("builtin/")
    return next((e for e in catalogue() if e.name == name), None)


def catalogue_info(entry: CatalogueEntry) -> dict[str, Any]:
    config, files = entry.config(), entry.files()
    return {"name": entry.name, "environment_id": entry.environment_id, "description": config.get("description", ""),
            "config": config, "files": sorted(files), "row_keys": list(row_keys(files))}


# ---- reading CONFIG without importing ----------------------------------------------------------

@dataclass(frozen=True)
class ConfigSite:
    """Where a package's CONFIG is bound: `path` (in the package's files; None when it comes from a
    module outside the package) and the value assigned there (None when that file assigns none yet)."""
    path: str | None
    value: ast.expr | None


def _assigned(node: ast.stmt, name: str) -> ast.expr | None:
    """The value `node` assigns to `name` (`name = ...` or `name: T = ...`), if it does."""
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
        return node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
        return node.value
    return None


def _last_binding(tree: ast.Module | None, name: str) -> ast.expr | None:
    """The value of the last module-level assignment to `name` in `tree`: the one Python keeps."""
    found = None
    for node in tree.body if tree is not None else []:
        found = _assigned(node, name) or found
    return found


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether `node` binds `name`: an assignment, or an import."""
    if _assigned(node, name) is not None:
        return True
    return isinstance(node, (ast.Import, ast.ImportFrom)) and any((alias.asname or alias.name) == name for alias in node.names)


def _inner_statements(node: ast.stmt) -> Iterator[ast.stmt]:
    """The statements inside a compound statement (if, try, with, for, while, match), at any depth, but
    not inside a def or a class: those run, or not, as the module runs."""
    for child in [*getattr(node, "body", []), *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                  *getattr(node, "handlers", []), *getattr(node, "cases", [])]:
        for stmt in child.body if isinstance(child, (ast.ExceptHandler, ast.match_case)) else [child]:
            yield stmt
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from _inner_statements(stmt)


def conditional_config(files: dict[str, bytes]) -> tuple[str, int] | None:
    """(path, line) of a CONFIG bound inside an if/try/with/for/while/match block of __init__.py or of the
    file config_site reads. Which binding the run loads then depends on what the module does as it
    runs, while the Studio reads, shows and edits only a top-level one: it would show and save
    another CONFIG than the run's."""
    root = package_prefix(files) or ""
    for path in dict.fromkeys([root + "__init__.py", config_site(files).path or ""]):
        try:
            tree = ast.parse(files[path]) if path in files else None
        except (SyntaxError, ValueError):
            continue  # static_findings reports the syntax error
        for top in tree.body if tree is not None else []:
            if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            found = next((stmt for stmt in _inner_statements(top) if _binds(stmt, "CONFIG")), None)
            if found is not None:
                return path, found.lineno
    return None


def config_site(files: dict[str, bytes]) -> ConfigSite:
    """Where the CONFIG a run loads is defined, by the engine's rule (training.engine.packages.package_config):
    the package module's own CONFIG once __init__.py ran (its last module-level binding there: an
    assignment, or an import from one of the package's modules), else config.py's. The Studio reads,
    checks and edits CONFIG there and nowhere else: a CONFIG saved to config.py while __init__.py
    defined its own was shown everywhere and never used by the run."""
    root = package_prefix(files) or ""
    path: str | None = root + CONFIG_FILE
    name = "CONFIG"
    init = parsed_init(files)
    for node in init.body if init is not None else []:
        if _assigned(node, "CONFIG") is not None:
            path, name = root + "__init__.py", "CONFIG"
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:
            for alias in node.names:
                if (alias.asname or alias.name) == "CONFIG":
                    module = root + (node.module or "").replace(".", "/") + ".py"
                    # `from .config import CONFIG`, or `from config import CONFIG` of its own module (the engine puts the package on sys.path)
                    path, name = (module, alias.name) if node.module and (node.level == 1 or module in files) else (None, alias.name)
    source = files.get(path) if path is not None else None
    try:
        tree = ast.parse(source) if source is not None else None
    except (SyntaxError, ValueError):
        tree = None
    return ConfigSite(path, _last_binding(tree, name))


def read_config(files: dict[str, bytes]) -> dict[str, Any] | None:
    """The package's CONFIG, where the run takes it from (config_site), when it is a literal dict; else None."""
    site = config_site(files)
    if site.value is None:
        return None
    try:
        value = ast.literal_eval(site.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def config_literal_finding(files: dict[str, bytes], field: str = FIELD) -> list[Finding]:
    """A CONFIG that is there but not a literal dict: the Studio could neither show, edit nor check it,
    and a run loading it failed as it loaded (a KeyError), with nothing said before START."""
    site = config_site(files)
    if site.value is not None and read_config(files) is None:
        return [Finding(field, f"{site.path}:{site.value.lineno}: CONFIG must be a literal dict, e.g. CONFIG = {{\"max_examples\": 10}}, not an expression: "
                               "the Studio reads it without running the package, to show, check and edit it")]
    return []


def config_place_finding(files: dict[str, bytes], field: str = FIELD) -> list[Finding]:
    """A CONFIG bound in a block (conditional_config): GET …/check lists it, START refuses it and the
    Studio saves no CONFIG into such a package, since it would save one the run does not load."""
    found = conditional_config(files)
    if found is None:
        return []
    path, line = found
    return [Finding(field, f"{path}:{line}: CONFIG is bound inside an if/try/with/for block, so which CONFIG the run loads depends on how the "
                           "module runs, while the Studio reads, shows and edits only a top-level one: move CONFIG to a top-level assignment, "
                           "e.g. CONFIG = {\"max_examples\": 10}")]


def edited_config_file(files: dict[str, bytes], config: dict[str, Any]) -> tuple[str, bytes]:
    """(path, new content) of the file that defines the package's CONFIG (config_site), with `config` in
    place of the value it assigns: the rest of the file (comments, other names) stays as it was. A
    package with no CONFIG yet gets config.py, which the engine reads when __init__.py defines none."""
    misplaced = config_place_finding(files, "config")
    if misplaced:
        raise BadRequest("The Studio cannot tell which CONFIG this package loads.", misplaced)
    site = config_site(files)
    if site.path is None:
        raise BadRequest("This package takes its CONFIG from a module outside it.",
                         [Finding("config", "define CONFIG in the package (config.py or __init__.py) to edit it here")])
    source = files.get(site.path)
    text = pprint.pformat(config, indent=4, sort_dicts=False, width=110)
    if source is None:
        return site.path, render_config(config).encode()
    if site.value is None:
        return site.path, source.rstrip() + (b"\n\n" if source.strip() else b"") + f"CONFIG = {text}\n".encode()
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:site.value.lineno - 1]) + site.value.col_offset  # ast offsets count UTF-8 bytes
    end = sum(len(line) for line in lines[:(site.value.end_lineno or site.value.lineno) - 1]) + (site.value.end_col_offset or 0)
    return site.path, source[:start] + text.encode() + source[end:]


def render_config(config: dict[str, Any]) -> str:
    return (
        '"""Arguments of this environment: edit them here (load_environment(**CONFIG) is what runs)."""\n\n'
        f"CONFIG = {pprint.pformat(config, indent=4, sort_dicts=False, width=110)}\n"
    )


def required_config_keys(init: ast.Module) -> dict[str, int]:
    """The CONFIG keys load_environment cannot do without: each `cfg["key"]` it reads (key → line),
    where `cfg` is CONFIG, its **kwargs, or a name the function assigns from either (the catalogue's
    `cfg = {**CONFIG, **kwargs}`). A key it also reads with `.get("key")` is optional."""
    keys, optional = _config_reads(init)
    return {key: line for key, line in keys.items() if key not in optional}


def _config_reads(init: ast.Module) -> tuple[dict[str, int], set[str]]:
    """The keys load_environment reads from its config as `cfg["key"]` (key → line) and as `cfg.get("key")`."""
    entry = next((n for n in init.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "load_environment"), None)
    if entry is None:
        return {}, set()
    sources = {"CONFIG"} | ({entry.args.kwarg.arg} if entry.args.kwarg else set())
    for node in ast.walk(entry):
        if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) and n.id in sources for n in ast.walk(node.value)):
            sources |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    keys: dict[str, int] = {}
    optional: set[str] = set()
    for node in ast.walk(entry):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name)
                and node.value.id in sources and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            keys.setdefault(node.slice.value, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Name) and node.func.value.id in sources
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            optional.add(node.args[0].value)  # `if cfg.get("k"): ... cfg["k"]` reads it only when it is there
    return keys, optional


def config_findings(reference: dict[str, Any] | None, config: dict[str, Any], files: dict[str, bytes], field: str = "config") -> list[Finding]:
    """A new CONFIG checked against the one it replaces (`reference`: the catalogue's, or the repo's) and
    the package it configures: the run loads it with load_environment(**CONFIG), so a wrong type
    failed the run with a bare TypeError, a misspelt key was silently unused, and a data file the
    package does not have failed it with FileNotFoundError. What the package declares (CONFIG_TYPES,
    REWARD_COMPONENTS: environments/declarations.py) is checked too, where the reference cannot say:
    a key whose default is None, a weight's name."""
    init = parsed_init(files)
    findings = missing_config_findings(init, config, field)
    reads, optional = _config_reads(init) if init is not None else ({}, set())
    params, passes_on = _entry_parameters(init) if init is not None else (set(), True)
    known = set(reference or {}) | set(reads) | optional | params | set(CONFIG_METADATA)
    root = package_prefix(files) or ""
    # Only where every key it can take is visible: one that hands its **kwargs on (a Taskset) may read any.
    for key in sorted(set(config) - known) if not passes_on else []:
        findings.append(Finding(f"{field}.{key}", f"load_environment does not read {key!r}: remove it, or use one of {', '.join(sorted(known))}"))
    for key, was in (reference or {}).items():
        if key in config:
            findings += _same_shape(f"{field}.{key}", was, config[key])
            now = config[key]
            if not (isinstance(was, str) and root + was in files and isinstance(now, str) and now != was):
                continue
            if not PurePosixPath(now).is_absolute():
                if root + now not in files:
                    findings.append(Finding(f"{field}.{key}", f"the package has no file {now!r} (it has {package_files_named(files, root)}): "
                                                              "name one of its files, or push the file to the repo first"))
            elif problem := studio_data_problem(now, FILE_INSTEAD):
                findings.append(Finding(f"{field}.{key}", problem))
            elif not readable_local_file(now):
                findings.append(Finding(f"{field}.{key}", f"{now} is not a file on the Studio's machine that runs may read: name one of the package's files "
                                                          f"({was!r}), or push the file to the repo first"))
    said = {f.field for f in findings}  # one finding a field: the reference's, where both see a wrong type
    findings += [f for f in declared_config_findings(declared(init), config, field) if f.field not in said]
    said = {f.field for f in findings}
    return findings + [f for f in jsonl_file_findings(init, config, files, field) if f.field not in said]


def package_files_named(files: dict[str, bytes], root: str, most: int = 20) -> str:
    """The package's files, by their path under its root (as CONFIG names them), for a finding:
    the first `most` in order, and how many more."""
    names = sorted(path.removeprefix(root) for path in files if path.startswith(root))
    shown = ", ".join(map(repr, names[:most]))
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def stored_file_names(config: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """`config` with each value that names a package file in another Unicode form than the file's
    stored name (données.jsonl typed, with é as one character, for the decomposed e + U+0301 that
    macOS writes) replaced by the stored name: the run opens the file by its bytes, and Linux
    reads the two forms as two names. Equal under NFC is the match; a value that matches no file,
    or names one exactly, stays as given."""
    root = package_prefix(files) or ""
    stored: dict[str, str] = {}
    for path in files:
        if path.startswith(root):
            stored.setdefault(unicodedata.normalize("NFC", path.removeprefix(root)), path.removeprefix(root))
    return {key: stored.get(unicodedata.normalize("NFC", value), value) if isinstance(value, str) and root + value not in files else value
            for key, value in config.items()}


def readable_local_file(path: str) -> bool:
    """Whether a run may read the absolute `path` a CONFIG names: a file inside STUDIO_LOCAL_ROOTS that
    the Studio's user can read. It is read on the machine that runs the engine: the local backend's is
    this one."""
    file = Path(path)
    return inside_local_roots(file) and file.is_file() and os.access(file, os.R_OK)


def local_file_findings(config: dict[str, Any] | None, field: str = FIELD) -> list[Finding]:
    """START's look at each absolute file path in the package's CONFIG (a value naming a file with an
    extension, /data/maths.jsonl: not an absolute URL path such as /v1/completions): a PUT checked it
    when it was saved, but a file deleted, made unreadable or moved out of STUDIO_LOCAL_ROOTS since
    then started the run, which failed in the engine as the package loaded."""
    findings = []
    for key, value in (config or {}).items():
        if not (isinstance(value, str) and PurePosixPath(value).is_absolute() and PurePosixPath(value).suffix):
            continue
        if problem := studio_data_problem(value, FILE_INSTEAD):  # saved before CONFIG refused it
            findings.append(config_key_finding(field, key, problem))
        elif not readable_local_file(value):
            findings.append(config_key_finding(field, key, f"{value} is not a file on the Studio's machine that runs may read (deleted, unreadable or outside "
                                                           f"STUDIO_LOCAL_ROOTS since CONFIG was saved): put the file back, or set {key} to one of the package's files"))
    return findings


def jsonl_file_findings(init: ast.Module | None, config: dict[str, Any] | None, files: dict[str, bytes], field: str = FIELD) -> list[Finding]:
    """Each file a JSONL_FILES key of CONFIG names (the package's own, or an absolute path runs may
    read), read as the engine's loader reads it (training.engine.packages.jsonl_problem): its first
    DATAHUB_VALIDATE_MAX_ROWS rows, none over DATAHUB_MAX_ROW_BYTES. A file that is not JSON Lines
    (data_file: /etc/passwd) passed every check and failed the run as the package loaded. A file
    missing or out of reach is the other checks' finding."""
    findings = []
    root = package_prefix(files) or ""
    for key in jsonl_files(declared(init)):
        value = (config or {}).get(key)
        if not isinstance(value, str) or not value:
            continue
        if not PurePosixPath(value).is_absolute():
            content = files.get(root + value)
            problem = None if content is None else jsonl_problem(io.BytesIO(content), settings.DATAHUB_VALIDATE_MAX_ROWS, settings.DATAHUB_MAX_ROW_BYTES)
        elif readable_local_file(value) and not studio_data_problem(value, FILE_INSTEAD):
            with open(value, "rb") as fh:
                problem = jsonl_problem(fh, settings.DATAHUB_VALIDATE_MAX_ROWS, settings.DATAHUB_MAX_ROW_BYTES)
        else:
            continue
        if problem is not None:
            line, what = problem
            findings.append(config_key_finding(field, key, f"{value} line {line} is {what}, and load_environment reads {key} as JSON Lines "
                                                           f"(one JSON object a line): name a .jsonl file of rows like the package's own, or fix that line"))
    return findings


def declared(init: ast.Module | None) -> ast.Module | None:
    """`init` (a parsed __init__.py) with each declaration it lacks (CONFIG_TYPES, REWARD_COMPONENTS,
    CONFIG_RANGES) taken from the catalogue package whose code it is. A fork made before the catalogue
    declared them runs that same code, so they hold for it too. Keyed on the code, not on the
    "Forked from" the fork records: a fork whose code was edited since may weigh other components or
    read other types, so it keeps the checks against the CONFIG it replaces."""
    if init is None or all(assignment(init, name) for name in DECLARATIONS):
        return init
    runs = code(init)
    for entry in catalogue():
        theirs = ast.parse((entry.directory / "__init__.py").read_bytes())
        if code(theirs) == runs:
            return with_declarations(init, theirs)
    return init


def _entry_parameters(init: ast.Module) -> tuple[set[str], bool]:
    """load_environment's named parameters, and whether it hands its **kwargs on to another call
    (True too when there is no such function to read)."""
    entry = next((n for n in init.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "load_environment"), None)
    if entry is None:
        return set(), True
    names = {a.arg for a in entry.args.args + entry.args.kwonlyargs}
    kwarg = entry.args.kwarg.arg if entry.args.kwarg else None
    passes_on = kwarg is not None and any(isinstance(node, ast.keyword) and node.arg is None and isinstance(node.value, ast.Name) and node.value.id == kwarg
                                          for node in ast.walk(entry))
    return names, passes_on


def _same_shape(path: str, was: Any, now: Any) -> list[Finding]:
    """`now` has the JSON type of `was` (None in `was` takes anything), and so do an object's members."""
    kinds = ((bool, "true or false"), ((int, float), "a number"), (str, "a string"), (list, "a list"), (dict, "an object"))
    if was is None:
        return []
    for types, name in kinds:
        if isinstance(was, types):
            if not isinstance(now, types) or (types is not bool and isinstance(now, bool)):
                return [Finding(path, f"must be {name}, as it is now ({was!r}); got {now!r}")]
            break
    if isinstance(was, dict) and isinstance(now, dict):
        return [f for key in was if key in now for f in _same_shape(f"{path}.{key}", was[key], now[key])]
    return []


def merged_config(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on `base`, objects merged member by member (a fork that changes one weight keeps the others)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged_config(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def missing_config_findings(init: ast.Module | None, config: dict[str, Any] | None, field: str) -> list[Finding]:
    """Keys load_environment (in the parsed __init__.py `init`) reads that `config` (the package's
    CONFIG, or one about to replace it) lacks: the run would fail with a KeyError as it loads."""
    if config is None or init is None:
        return []
    return [
        Finding(field if field != "config" else f"config.{key}",
                f"CONFIG has no {key!r}, which load_environment reads (__init__.py:{line}): put it back in CONFIG")
        for key, line in sorted(required_config_keys(init).items()) if key not in config
    ]


def parsed_init(files: dict[str, bytes]) -> ast.Module | None:
    """The package's __init__.py, parsed; None when it is missing or does not parse (static_findings says why)."""
    source = files.get((package_prefix(files) or "") + "__init__.py")
    try:
        return ast.parse(source) if source is not None else None
    except (SyntaxError, ValueError):
        return None


# ---- static package checks (no import) ---------------------------------------------------------

def package_prefix(files: dict[str, bytes]) -> str | None:
    """'' when __init__.py is at the root, 'pkg/' for a single top-level package, else None."""
    if "__init__.py" in files:
        return ""
    subs = sorted({p.split("/", 1)[0] for p in files if p.count("/") == 1 and p.endswith("/__init__.py")})
    return f"{subs[0]}/" if len(subs) == 1 else None


def _is_taskset_base(base: ast.expr) -> bool:
    if isinstance(base, ast.Subscript):  # vf.Taskset[MyTask]
        base = base.value
    return (isinstance(base, ast.Name) and base.id == "Taskset") or (isinstance(base, ast.Attribute) and base.attr == "Taskset")


def static_findings(files: dict[str, bytes], image_has: Callable[[str], bool], *, field: str = FIELD, where: str = "the trainer image",
                    config_field: str | None = None) -> list[Finding]:
    """Problems a package would hit at import time or as it loads, found by parsing it: no entry point,
    syntax errors, imports that neither the standard library, the package itself nor the trainer image
    provides, and a CONFIG that lacks a key it reads or breaks what it declares. CONFIG's values are
    reported on `config_field` (default `field`): "config" names each key's path, config.max_examples."""
    prefix = package_prefix(files)
    if prefix is None:
        return [Finding(field, "the environment has no __init__.py at its root: an environment is a Python package whose __init__.py exposes load_environment(**kwargs)")]
    own = {prefix.rstrip("/")} if prefix else set()
    modules: dict[str, ast.Module] = {}
    findings: list[Finding] = []
    for path, source in sorted(files.items()):
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix):]
        first = rel.split("/", 1)[0]
        if "/" in rel or rel.endswith(".py"):
            own.add(PurePosixPath(first).stem if first.endswith(".py") else first)
        if not rel.endswith(".py"):
            continue
        try:
            modules[rel] = ast.parse(source, filename=path)
        except SyntaxError as exc:
            findings.append(Finding(field, f"{path}:{exc.lineno}: syntax error ({exc.msg}): the package cannot be imported"))
        except ValueError as exc:  # NUL bytes
            findings.append(Finding(field, f"{path}: cannot be parsed ({exc})"))
    unmet: dict[str, str] = {}
    for rel, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".", 1)[0]
                if top in sys.stdlib_module_names or top in own or top == "__future__" or top in unmet:
                    continue
                if not image_has(top):
                    unmet[top] = f"{prefix}{rel}:{node.lineno}"
    for module, at in unmet.items():
        findings.append(Finding(field, f"the environment imports {module!r} ({at}), which {where} does not ship: an environment may import only the standard library, the image's packages and its own modules"))
    init = modules.get("__init__.py")
    if init is not None and not _has_entry_point(init, modules):
        findings.append(Finding(field, "the package's __init__.py has no module-level load_environment(**kwargs) (and exports no verifiers Taskset subclass)"))
    findings += config_literal_finding(files, field)
    findings += config_place_finding(files, field)
    findings += missing_config_findings(init, read_config(files), field)
    findings += row_keys_finding(files, field)
    findings += declaration_findings(init, field)
    findings += declared_config_findings(declared(init), read_config(files), config_field or field)
    findings += local_file_findings(read_config(files), config_field or field)
    findings += jsonl_file_findings(init, read_config(files), files, config_field or field)
    return findings


def _has_entry_point(init: ast.Module, modules: dict[str, ast.Module]) -> bool:
    tasksets = {n.name for tree in modules.values() for n in tree.body if isinstance(n, ast.ClassDef) and any(_is_taskset_base(b) for b in n.bases)}
    for node in init.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "load_environment":
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "load_environment" for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == "load_environment" or alias.name in tasksets:
                    return True
        if isinstance(node, ast.ClassDef) and node.name in tasksets:
            return True
    return False


# ---- a run's environment -----------------------------------------------------------------------

def hub_package_files(commit) -> dict[str, bytes]:
    from datahub import storage
    from datahub.repos import tree

    out = {}
    for path, blob in tree(commit).items():
        if set(PurePosixPath(path).parts) & SKIP_PARTS:
            continue
        with storage.open_blob(blob.storage_name) as fh:
            out[path] = fh.read()
    return out


def environment_findings(draft, image_has: Callable[[str], bool]) -> list[Finding]:
    """Pre-start (422) checks of a GRPO run's Environment-mode package. An unresolvable Data Hub ref is
    left to datahub.refs.ref_findings, which reports it on the same field."""
    config = draft.config if isinstance(draft.config, dict) else {}
    if draft.method == "grpo" and config.get("rl_mode") == "ruler":
        return ruler_findings(config)
    env_id = _environment_id(draft)
    if env_id is None:
        return []  # not Environment mode, or the GRPO method check reports a missing environment_id
    if findings := builtin_ref_findings(draft):  # a run stored before the rule
        return findings
    name = env_id.split("@", 1)[0]
    backend = (draft.compute or {}).get("backend", "local") if isinstance(draft.compute, dict) else "local"
    where = "this machine's trainer environment" if backend == "local" else f"the {backend} trainer image"
    if name.startswith("builtin/"):
        if name in ENGINE_BUILTINS:
            return []
        if catalogue_entry(name) is None:
            known = sorted(ENGINE_BUILTINS) + [f"builtin/{e.name}" for e in catalogue()]
            return [Finding(FIELD, f"{env_id!r} is not a built-in environment: use one of {', '.join(known)}, or fork one into your project")]
    elif "@" not in env_id:
        return [Finding(FIELD, f'"{env_id}" is not an environment ref: write "<repo>@<ref>" (a Data Hub environment repo) or "builtin/<name>@main"')]
    files = _package_files(draft.project, env_id)
    if files is None:
        return []
    if not files:
        return [Finding(FIELD, f"{env_id} is empty: push a package whose __init__.py exposes load_environment(**kwargs)")]
    return static_findings(files, image_has, where=where)


def builtin_ref_findings(draft) -> list[Finding]:
    """A built-in environment named at a version it does not have, as create, PATCH and START check
    it. Built-ins (the catalogue's, the engine's builtin/arith) are not versioned: the only ref is
    `main` (CatalogueEntry.environment_id), and a bare `builtin/<name>` means the same; any other
    ref would train on main while the run's config says otherwise."""
    env_id = _environment_id(draft)
    if env_id is None or not env_id.startswith("builtin/") or "@" not in env_id:
        return []
    name, ref = env_id.split("@", 1)
    if ref == MAIN_REF:
        return []
    return [Finding(FIELD, f"{env_id!r}: built-in environments are not versioned and have only @{MAIN_REF}: write {name}@{MAIN_REF}, "
                           "or fork it into your project to pin a version of your own")]


def _environment_id(draft) -> str | None:
    """The environment a GRPO run in Environment mode names, when it names one."""
    config = draft.config if isinstance(draft.config, dict) else {}
    if draft.method != "grpo" or config.get("rl_mode", "environment") != "environment":
        return None
    env_id = config.get("environment_id")
    return env_id if isinstance(env_id, str) and env_id else None


def _package_files(project, env_id: str) -> dict[str, bytes] | None:
    """A catalogue package's or a Data Hub environment repo's files; None when `env_id` names neither
    (an engine built-in, an unknown name, a ref that does not resolve)."""
    from datahub.refs import is_hub_ref, resolve_ref

    name = env_id.split("@", 1)[0]
    if name.startswith("builtin/"):
        entry = catalogue_entry(name)
        return entry.files() if entry is not None else None
    if project is None or "@" not in env_id or not is_hub_ref(env_id):
        return None
    resolved = resolve_ref(project, env_id)
    if resolved is None:
        return None
    from datahub.models import Commit

    return hub_package_files(Commit.objects.get(pk=resolved.commit))


def _row_keys_assignment(init: ast.Module | None) -> ast.Assign | ast.AnnAssign | None:
    """The module-level `ROW_KEYS = ...` of a parsed __init__.py, if it has one."""
    return assignment(init, "ROW_KEYS")


def _literal_row_keys(node: ast.Assign | ast.AnnAssign | None) -> tuple[str, ...]:
    if node is None or node.value is None:
        return ()
    try:
        value = ast.literal_eval(node.value)
    except ValueError:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) and all(isinstance(k, str) for k in value) else ()


def row_keys_finding(files: dict[str, bytes], field: str = FIELD) -> list[Finding]:
    """A ROW_KEYS that is there but not a literal tuple of names: Studio reads it without importing the
    package, so it could not check a run's dataset for those columns before START."""
    node = _row_keys_assignment(parsed_init(files))
    if node is not None and not _literal_row_keys(node):
        return [Finding(field, f"__init__.py:{node.lineno}: ROW_KEYS must be a literal tuple of column names, e.g. ROW_KEYS = (\"prompt\", \"answer\")")]
    return []


def row_keys(files: dict[str, bytes]) -> tuple[str, ...]:
    """The columns a package's score() reads from each row: ``ROW_KEYS`` in its __init__.py, a literal
    tuple of names. A GRPO run that brings its own dataset must have them in every row."""
    return _literal_row_keys(_row_keys_assignment(parsed_init(files)))


def dataset_row_needs(draft) -> RowNeeds | None:
    """What each row of a GRPO run's own dataset needs for its environment to score it (None: nothing
    beyond the method's prompt column)."""
    env_id = _environment_id(draft)
    if env_id is None or not draft.dataset:
        return None
    files = _package_files(draft.project, env_id)
    keys = row_keys(files) if files else ()
    return RowNeeds(keys, env_id.split("@", 1)[0]) if keys else None


def ruler_findings(config: dict[str, Any]) -> list[Finding]:
    """What the engine's RULER judge needs beyond the method's checks: an http(s) URL."""
    judge = config.get("judge")
    if not isinstance(judge, dict):
        judge = {}
    if judge.get("mode", "external") != "external":
        return []
    findings = []
    endpoint = judge.get("endpoint")
    if isinstance(endpoint, str) and endpoint and not endpoint.startswith(("http://", "https://")):
        findings.append(Finding("config.judge.endpoint", "the judge endpoint is the http(s) base URL of an OpenAI-compatible API, e.g. https://api.example.com/v1"))
    return findings  # no model: the engine uses the one the endpoint lists at /models


def checkout(files: dict[str, bytes], dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    for path, data in files.items():
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return dest


def stage_dir(run) -> Path:
    """Where the local backend's engine finds the staged package (beside the attempt's run dir)."""
    return Path(settings.STUDIO_RUNS_DIR) / str(run.pk) / f"attempt-{run.attempt}" / "environment"


def job_environment(run) -> dict[str, Any] | None:
    """The spec's ``environment`` block for one attempt, staging what the engine will load.

    Environment mode: ``{"id", "package"?, "files"?, "repo"?, "commit"?, "hub_url"?, "path"?}`` — on the
    local backend the pinned commit's files are checked out to the run dir (``path``); remote backends
    get ``repo`` + ``commit`` and fetch them through the Data Hub's HF API; a catalogue package travels
    inline (``files``) to remote backends. RULER mode: ``{"id": "builtin/ruler_task",
    "ruler_dataset"?: {"path", "revision", "data_hub"?}}`` when its dataset is a Data Hub ref.
    """
    config = run.config or {}
    if run.method != "grpo":
        return None
    local = (run.compute or {}).get("backend", "local") == "local"
    if config.get("rl_mode") == "ruler":
        block: dict[str, Any] = {"id": "builtin/ruler_task"}
        pin = (run.pinned or {}).get("config.ruler_task_args.dataset")
        if pin:
            block["ruler_dataset"] = _stage_hub(run, pin, local, "ruler-dataset") or {"path": pin["repo"], "revision": pin["commit"], "data_hub": True}
        return block
    env_id = config.get("environment_id") or ""
    name = env_id.split("@", 1)[0]
    block = {"id": env_id}
    if name.startswith("builtin/"):
        entry = catalogue_entry(name)
        if entry is not None:
            block["package"] = entry.directory.name
            if local:
                block["path"] = str(entry.directory)
            else:  # a few KB of text: the job needs nothing from the Studio's disk or the image
                block["files"] = {p: data.decode() for p, data in entry.files().items()}
        return block
    pin = (run.pinned or {}).get(FIELD)
    if pin:
        block.update(repo=pin["repo"], commit=pin["commit"], hub_url=f"{settings.STUDIO_PUBLIC_URL}/hub")
        staged = _stage_hub(run, pin, local, "environment")
        if staged:
            block["path"] = staged["path"]
    return block


def _stage_hub(run, pin: dict, local: bool, folder: str) -> dict[str, Any] | None:
    """Check the pinned commit's files out beside the local run dir. On failure the block keeps repo +
    commit only and the engine fails the run before its first step, saying what it could not load."""
    if not local:
        return None
    from datahub.models import Commit

    try:
        commit = Commit.objects.filter(pk=pin["commit"]).first()
        if commit is None:
            return None
        dest = checkout(hub_package_files(commit), stage_dir(run).parent / folder)
    except Exception:  # noqa: BLE001
        log.exception("run %s: staging %s@%s failed", run.pk, pin.get("repo"), pin.get("commit"))
        return None
    return {"path": str(dest), "revision": None}


def judge_env(run) -> dict[str, str]:
    """The external judge's API key for the engine's environment (never the spec or the run config)."""
    config = run.config or {}
    judge = config.get("judge") or {}
    if run.method != "grpo" or config.get("rl_mode") != "ruler" or judge.get("mode", "external") != "external":
        return {}
    secret = judge.get("api_key_secret")
    if not secret:
        return {}
    from studio.services import reveal_secret

    try:
        return {"STUDIO_JUDGE_API_KEY": reveal_secret(run.project, secret)}
    except Exception:  # noqa: BLE001 - deleted since START: the engine fails the run naming api_key_secret
        log.warning("run %s: the judge's secret %r could not be read at dispatch", run.pk, secret)
        return {}


# ---- fork and CONFIG edits ---------------------------------------------------------------------

def fork(project, catalogue_name: str, name: str | None = None, config: dict[str, Any] | None = None, user=None) -> dict[str, Any]:
    """Copy a catalogue package into a new environment repo of `project`; CONFIG lands in config.py."""
    from datahub.commits import commit_files
    from datahub.models import RepoType
    from datahub.repos import create_repo

    entry = catalogue_entry(catalogue_name or "")
    engine_builtin = "builtin/" + (catalogue_name or "").split("@", 1)[0].removeprefix("builtin/")
    if entry is None and engine_builtin in ENGINE_BUILTINS:
        # Listed by the catalogue (forkable: false), so "no such environment" misled: it has no package to copy.
        raise BadRequest(f"{engine_builtin} ships with the engine and cannot be forked.", [Finding(
            "catalogue", f'train on it as it is (config.environment_id "{engine_builtin}@main"), or fork one of '
                         f"{', '.join(e.name for e in catalogue())} to version an environment of your own")])
    if entry is None:
        raise NotFound(f"The catalogue has no environment {catalogue_name!r}.", [Finding("catalogue", f"use one of {', '.join(e.name for e in catalogue())}")])
    repo_name = name or entry.name
    files = entry.files()
    merged = stored_file_names(merged_config(entry.config(), config or {}), files)
    wrong = config_findings(entry.config(), merged, files)
    if wrong:
        raise BadRequest(f"This CONFIG does not fit {entry.environment_id}.", wrong)
    path, content = edited_config_file(files, merged)
    files[path] = content
    repo = create_repo(project, repo_name, RepoType.ENVIRONMENT, user=user, description=f"Forked from {entry.environment_id}")
    # commit_files stores the blobs outside any transaction; the event follows the commit
    commit = commit_files(repo, "main", files, message=f"Fork {entry.environment_id} from the Studio catalogue", author=user)
    audit.record(AuditEvent.Action.CREATED, repo, user=user, details={"type": repo.type, "forked_from": entry.environment_id, "commit": commit.pk})
    return {"repo": repo.name, "environment_id": f"{repo.name}@main", "commit": commit.pk, "forked_from": entry.environment_id, "config": merged}


def environment_repo(project, name: str):
    from datahub.models import RepoType
    from datahub.repos import find_repo

    repo = find_repo(project, name)
    if repo is None or repo.type != RepoType.ENVIRONMENT:
        raise NotFound(f"Project {project.slug} has no environment repo {name!r}.", [Finding("name", "fork one from the catalogue or create an environment repo")])
    return repo


def repo_config(project, name: str, ref: str = "main") -> dict[str, Any]:
    from datahub.repos import resolve

    repo = environment_repo(project, name)
    commit = resolve(repo, ref)
    files = hub_package_files(commit)
    return {"repo": repo.name, "environment_id": f"{repo.name}@{ref}", "commit": commit.pk, "config": read_config(files), "files": sorted(files),
            "row_keys": list(row_keys(files))}


def check_repo(project, name: str, ref: str = "main", backend_name: str = "local") -> dict[str, Any]:
    """The static checks START runs, for an environment repo page or a push: {"commit", "findings"}."""
    from datahub.repos import resolve
    from training.backends import get_backend

    repo = environment_repo(project, name)
    backend = get_backend(backend_name)
    if backend is None:
        raise BadRequest(f"Unknown backend {backend_name!r}.", [Finding("backend", "use local, dstack or modal")])
    commit = resolve(repo, ref)
    where = "this machine's trainer environment" if backend_name == "local" else f"the {backend_name} trainer image"
    # CONFIG's own values by their path, as PUT …/config names them (START names config.environment_id).
    found = static_findings(hub_package_files(commit), backend.image_has, where=where, config_field="config")
    return {"repo": repo.name, "commit": commit.pk, "backend": backend_name, "findings": [f.as_dict() for f in found]}


def first_config(repo) -> dict[str, Any] | None:
    """The CONFIG the repo's main branch first had: the package's defaults (a fork's, as forked)."""
    from datahub.repos import history

    for commit in reversed(history(repo, "main", limit=10_000)):
        config = read_config(hub_package_files(commit))
        if config is not None:
            return config
    return None


def _type_reference(current: dict[str, Any] | None, first: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a CONFIG edit is type-checked against: each key's first value where the package first had it
    (its default: one that started as None takes any value, unless the package declares its type in
    CONFIG_TYPES, and can go back to None), else its current one. Against the current value alone, `max_examples` set once from None to 10 could never be None
    again, and a wrong type that got in could not be corrected."""
    if current is None:
        return first
    return {key: first[key] if first is not None and key in first else value for key, value in current.items()}


def update_config(project, name: str, config: dict[str, Any], user=None) -> dict[str, Any]:
    from datahub.commits import commit_files
    from datahub.repos import resolve

    if not isinstance(config, dict):
        raise BadRequest("CONFIG must be an object.", [Finding("config", "send the whole CONFIG as a JSON object")])
    repo = environment_repo(project, name)
    files = hub_package_files(resolve(repo, "main"))
    config = stored_file_names(config, files)
    wrong = config_findings(_type_reference(read_config(files), first_config(repo)), config, files)
    if wrong:
        raise BadRequest("This CONFIG does not fit the environment (a PUT replaces the whole CONFIG).", wrong)
    path, content = edited_config_file(files, config)
    commit = commit_files(repo, "main", {path: content}, message="Edit CONFIG", author=user)
    # the keys alone: a CONFIG value may be a path or an address the trail need not repeat
    audit.record(AuditEvent.Action.PATCHED, repo, user=user, details={"file": path, "commit": commit.pk, "config_keys": sorted(config)})
    return {"repo": repo.name, "environment_id": f"{repo.name}@main", "commit": commit.pk, "config": config}
