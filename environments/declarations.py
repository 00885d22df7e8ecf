"""What an environment package declares about its CONFIG in ``__init__.py``, read without importing it
(module-level literals, like ``ROW_KEYS``), and the checks of a CONFIG against them:

- ``CONFIG_TYPES``: CONFIG key → the JSON type its value takes ("string", "integer", "number",
  "boolean", "list", "object", "null"), or a tuple of them, e.g. ``{"max_examples": ("integer", "null")}``.
  A default says its own type, but a default of None says nothing: ``"max_examples": "ten"`` was
  saved, and the run then failed as it loaded ("slice indices must be integers").
- ``REWARD_COMPONENTS``: the names score() returns besides ``total``, which ``CONFIG["weights"]``
  weighs. A weight for another name was never used, and a component without one silently weighed 0.

A package that declares neither is checked as before: against the CONFIG it replaces.
"""
from __future__ import annotations

import ast
from typing import Any

from studio.errors import Finding

TYPE_NAMES = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false",
              "list": "a list", "object": "an object", "null": "null"}
PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "number": (int, float), "list": list, "object": dict}
WEIGHTS = "weights"
MAX_UNKNOWN = 20  # unknown weight names reported, as for unknown query parameters


def assignment(init: ast.Module | None, name: str) -> ast.Assign | ast.AnnAssign | None:
    """The module-level `NAME = ...` (or `NAME: T = ...`) of a parsed __init__.py, if it has one."""
    for node in init.body if init is not None else []:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
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


def declaration_findings(init: ast.Module | None, field: str) -> list[Finding]:
    """A CONFIG_TYPES or REWARD_COMPONENTS that is there but cannot be read without importing the
    package: it would check nothing, silently."""
    findings = []
    node = assignment(init, "CONFIG_TYPES")
    if node is not None and not config_types(init):
        findings.append(Finding(field, f"__init__.py:{node.lineno}: CONFIG_TYPES must be a literal dict of CONFIG key → type name or tuple of them "
                                       f"({', '.join(TYPE_NAMES)}), e.g. CONFIG_TYPES = {{\"max_examples\": (\"integer\", \"null\")}}"))
    node = assignment(init, "REWARD_COMPONENTS")
    if node is not None and not reward_components(init):
        findings.append(Finding(field, f"__init__.py:{node.lineno}: REWARD_COMPONENTS must be a literal tuple of the names score() returns, "
                                       "e.g. REWARD_COMPONENTS = (\"correct\", \"format\")"))
    return findings


def is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    return not isinstance(value, bool) and isinstance(value, PYTHON_TYPES[name])  # True is an int to Python, not a number in JSON


def _finding(field: str, key: str, message: str) -> Finding:
    """On `config.<key>` where `field` is the CONFIG itself; on `field` (a run's config.environment_id), naming the key, elsewhere."""
    return Finding(f"{field}.{key}", message) if field == "config" else Finding(field, f"CONFIG.{key}: {message}")


def declared_config_findings(init: ast.Module | None, config: dict[str, Any] | None, field: str = "config") -> list[Finding]:
    """`config` (a CONFIG) against the package's CONFIG_TYPES and REWARD_COMPONENTS (in the parsed __init__.py `init`)."""
    if not isinstance(config, dict):
        return []
    findings = []
    for key, names in config_types(init).items():
        if key in config and not any(is_type(config[key], name) for name in names):
            kinds = " or ".join(TYPE_NAMES[name] for name in names)
            findings.append(_finding(field, key, f"must be {kinds}, as the environment declares (CONFIG_TYPES in __init__.py); got {config[key]!r}"))
    components = reward_components(init)
    weights = config.get(WEIGHTS)
    if components and isinstance(weights, dict):
        listed = ", ".join(components)
        unknown = [name for name in weights if name not in components]
        for name in unknown[:MAX_UNKNOWN]:
            findings.append(_finding(field, f"{WEIGHTS}.{name}", f"{name!r} is not a reward component of this environment, so its weight would never be used: "
                                                                 f"weigh only {listed} (REWARD_COMPONENTS in __init__.py)"))
        for name in components:
            if name not in weights:
                findings.append(_finding(field, f"{WEIGHTS}.{name}", f"the reward component {name!r} has no weight, and would count 0 in total without a word: "
                                                                     "give it one (0 leaves it out on purpose)"))
            elif not is_type(weights[name], "number"):
                findings.append(_finding(field, f"{WEIGHTS}.{name}", f"a weight must be a number; got {weights[name]!r}"))
    return findings
