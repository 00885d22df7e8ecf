"""What an environment package declares about its CONFIG in ``__init__.py``, read without importing it
(module-level literals, like ``ROW_KEYS``), and the checks of a CONFIG against them:

- ``CONFIG_TYPES``: CONFIG key → the JSON type its value takes ("string", "integer", "number",
  "boolean", "list", "object", "null"), or a tuple of them, e.g. ``{"max_examples": ("integer", "null")}``.
  A default says its own type, but a default of None says nothing: ``"max_examples": "ten"`` was
  saved, and the run then failed as it loaded ("slice indices must be integers").
- ``REWARD_COMPONENTS``: the names score() returns besides ``total``, which ``CONFIG["weights"]``
  weighs. A weight for another name was never used, and a component without one silently weighed 0.
- ``CONFIG_RANGES``: CONFIG key → ``(min, max)``, both inclusive, ``None`` for no bound, e.g.
  ``{"max_examples": (1, None), "keep_prob": (0, 1), "weights": (0, None)}``; on an object (the weights)
  each of its values. A number out of range is refused; null and other types are left to CONFIG_TYPES.
  ``max_examples: 0`` silently trained on every row, and ``-5`` on all but the last five.

- ``JSONL_FILES``: the CONFIG keys naming a JSON Lines file load_environment reads, e.g. ``("data_file",)``.
  Its rows are read as the loader reads them (one JSON object a line) before a run starts: a
  ``data_file: /etc/passwd`` passed every check and failed the run with a bare JSONDecodeError.

A package that declares none of them is checked as before: against the CONFIG it replaces.
"""
from __future__ import annotations

import ast
import math
from typing import Any

from studio.errors import Finding

TYPE_NAMES = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false",
              "list": "a list", "object": "an object", "null": "null"}
PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "number": (int, float), "list": list, "object": dict}
WEIGHTS = "weights"
DECLARATIONS = ("CONFIG_TYPES", "REWARD_COMPONENTS", "CONFIG_RANGES", "JSONL_FILES")
MAX_UNKNOWN = 20  # unknown weight names reported, as for unknown query parameters


def _assigns(node: ast.stmt, name: str) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def assignment(init: ast.Module | None, name: str) -> ast.Assign | ast.AnnAssign | None:
    """The module-level `NAME = ...` (or `NAME: T = ...`) of a parsed __init__.py, if it has one."""
    for node in init.body if init is not None else []:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _assigns(node, name):
            return node
    return None


def _literal(node: ast.Assign | ast.AnnAssign | None) -> Any:
    if node is None or node.value is None:
        return None
    try:
        return ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _types(value: Any) -> tuple[str, ...] | None:
    names = (value,) if isinstance(value, str) else value
    if isinstance(names, (tuple, list)) and names and all(isinstance(n, str) and n in TYPE_NAMES for n in names):
        return tuple(names)
    return None


def config_types(init: ast.Module | None) -> dict[str, tuple[str, ...]]:
    """CONFIG_TYPES, each value as a tuple of type names; {} when the package has none or it cannot be read."""
    value = _literal(assignment(init, "CONFIG_TYPES"))
    if not isinstance(value, dict) or not all(isinstance(k, str) and _types(v) for k, v in value.items()):
        return {}
    return {key: _types(names) or () for key, names in value.items()}


def reward_components(init: ast.Module | None) -> tuple[str, ...]:
    """REWARD_COMPONENTS; () when the package has none or it cannot be read."""
    value = _literal(assignment(init, "REWARD_COMPONENTS"))
    if isinstance(value, (tuple, list)) and value and all(isinstance(n, str) for n in value):
        return tuple(value)
    return ()


def jsonl_files(init: ast.Module | None) -> tuple[str, ...]:
    """JSONL_FILES; () when the package has none or it cannot be read."""
    value = _literal(assignment(init, "JSONL_FILES"))
    if isinstance(value, (tuple, list)) and value and all(isinstance(n, str) for n in value):
        return tuple(value)
    return ()


def _bound(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def config_ranges(init: ast.Module | None) -> dict[str, tuple[float | None, float | None]]:
    """CONFIG_RANGES as key → (min, max); {} when the package has none or it cannot be read."""
    value = _literal(assignment(init, "CONFIG_RANGES"))
    if not isinstance(value, dict) or not value:
        return {}
    for key, pair in value.items():
        if not (isinstance(key, str) and isinstance(pair, (tuple, list)) and len(pair) == 2 and all(_bound(b) for b in pair)
                and any(b is not None for b in pair)):
            return {}
        if None not in pair and pair[0] > pair[1]:
            return {}
    return {key: (pair[0], pair[1]) for key, pair in value.items()}


def declaration_findings(init: ast.Module | None, field: str) -> list[Finding]:
    """A CONFIG_TYPES, REWARD_COMPONENTS or CONFIG_RANGES that is there but cannot be read without
    importing the package: it would check nothing, silently."""
    findings = []
    node = assignment(init, "CONFIG_TYPES")
    if node is not None and not config_types(init):
        findings.append(Finding(field, f"__init__.py:{node.lineno}: CONFIG_TYPES must be a literal dict of CONFIG key → type name or tuple of them "
                                       f"({', '.join(TYPE_NAMES)}), e.g. CONFIG_TYPES = {{\"max_examples\": (\"integer\", \"null\")}}"))
    node = assignment(init, "REWARD_COMPONENTS")
    if node is not None and not reward_components(init):
        findings.append(Finding(field, f"__init__.py:{node.lineno}: REWARD_COMPONENTS must be a literal tuple of the names score() returns, "
                                       "e.g. REWARD_COMPONENTS = (\"correct\", \"format\")"))
    node = assignment(init, "JSONL_FILES")
    if node is not None and not jsonl_files(init):
        findings.append(Finding(field, f"__init__.py:{node.lineno}: JSONL_FILES must be a literal tuple of the CONFIG keys that name a JSON Lines file, "
                                       "e.g. JSONL_FILES = (\"data_file\",)"))
    node = assignment(init, "CONFIG_RANGES")
    if node is not None and not config_ranges(init):
        findings.append(Finding(field, f"__init__.py:{node.lineno}: CONFIG_RANGES must be a literal dict of CONFIG key → (min, max), numbers or None "
                                       "for no bound, min ≤ max, e.g. CONFIG_RANGES = {\"max_examples\": (1, None), \"keep_prob\": (0, 1)}"))
    return findings


def code(init: ast.Module) -> str:
    """The parsed __init__.py without its declarations (ROW_KEYS too) and comments: what runs."""
    body = [node for node in init.body if not any(_assigns(node, name) for name in (*DECLARATIONS, "ROW_KEYS"))]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def with_declarations(init: ast.Module, other: ast.Module) -> ast.Module:
    """`init` with each declaration it lacks taken from `other`, a package whose code it runs."""
    taken = [node for name in DECLARATIONS if assignment(init, name) is None for node in [assignment(other, name)] if node is not None]
    return ast.Module(body=[*taken, *init.body], type_ignores=[]) if taken else init


def is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    return not isinstance(value, bool) and isinstance(value, PYTHON_TYPES[name])  # True is an int to Python, not a number in JSON


def config_key_finding(field: str, key: str, message: str) -> Finding:
    """On `config.<key>` where `field` is the CONFIG itself; on `field` (a run's config.environment_id), naming the key, elsewhere."""
    return Finding(f"{field}.{key}", message) if field == "config" else Finding(field, f"CONFIG.{key}: {message}")


def _range(low: float | None, high: float | None) -> str:
    if high is None:
        return f"at least {low}"
    return f"at most {high}" if low is None else f"from {low} to {high}"


def _out_of_range(key: str, value: Any, low: float | None, high: float | None) -> dict[str, Any]:
    """Each number in `value` (itself, or an object's members) outside [low, high], by its key."""
    if isinstance(value, dict):
        return {k: v for name, member in value.items() for k, v in _out_of_range(f"{key}.{name}", member, low, high).items()}
    in_range = (low is None or value >= low) and (high is None or value <= high) if is_type(value, "number") else True
    return {} if in_range else {key: value}  # NaN is in no range


def declared_config_findings(init: ast.Module | None, config: dict[str, Any] | None, field: str = "config") -> list[Finding]:
    """`config` (a CONFIG) against the package's CONFIG_TYPES, REWARD_COMPONENTS and CONFIG_RANGES (in
    the parsed __init__.py `init`), one finding a value."""
    if not isinstance(config, dict):
        return []
    found: dict[str, str] = {}  # CONFIG key (weights.correct) → what is wrong with its value
    for key, names in config_types(init).items():
        if key in config and not any(is_type(config[key], name) for name in names):
            kinds = " or ".join(TYPE_NAMES[name] for name in names)
            found[key] = f"must be {kinds}, as the environment declares (CONFIG_TYPES in __init__.py); got {config[key]!r}"
    components = reward_components(init)
    weights = config.get(WEIGHTS)
    if components and isinstance(weights, dict):
        listed = ", ".join(components)
        unknown = [name for name in weights if name not in components]
        for name in unknown[:MAX_UNKNOWN]:
            found[f"{WEIGHTS}.{name}"] = (f"{name!r} is not a reward component of this environment, so its weight would never be used: "
                                          f"weigh only {listed} (REWARD_COMPONENTS in __init__.py)")
        for name in components:
            if name not in weights:
                found[f"{WEIGHTS}.{name}"] = (f"the reward component {name!r} has no weight, and would count 0 in total without a word: "
                                              "give it one (0 leaves it out on purpose)")
            elif not is_type(weights[name], "number"):
                found[f"{WEIGHTS}.{name}"] = f"a weight must be a number; got {weights[name]!r}"
    for key, (low, high) in config_ranges(init).items():
        bad = _out_of_range(key, config[key], low, high) if key in config else {}
        for path, value in list(bad.items())[:MAX_UNKNOWN]:
            found.setdefault(path, f"must be {_range(low, high)}, as the environment declares (CONFIG_RANGES in __init__.py); got {value!r}")
    return [config_key_finding(field, key, message) for key, message in found.items()]
