"""One experiment's runs side by side: which runs are compared (those chosen, or the newest with
points of the metric), the metric's curves, each run's last and best value, and the settings that
differ between them. The experiment page and GET /api/experiments/{id}/compare share it, so a bad
`metric` or `runs` is the same finding in both."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Exists, Max, Min, OuterRef, QuerySet

from datahub.refs import PINNED_THINGS
from studio.errors import Finding
from studio.parsing import ascii_int
from training import metrics
from training.models import TERMINAL_STATUSES, MetricPoint, TrainingRun
from training.refs import dataset_entries
from training.views import MAX_POINTS, chart_series, is_live, reports_open

COMPARE_LIMIT = 12
DEFAULT_METRIC = "loss"
GRPO_METRIC = "reward"
RUN_ID_MAX = 2**63 - 1  # a BigAutoField: a longer id names no run, and PostgreSQL refuses to compare with it
NOT_SET = "—"
NOT_PINNED = "nothing pinned: not started yet"
# The fields START pins (datahub.refs.pin_refs), in the order their rows show, and what each is called
# there: a RULER run's prompts are a dataset too, but not `dataset`.
PIN_ORDER = ("base_model", "dataset", "config.eval_dataset", "config.distillation.teacher_model", "config.environment_id",
             "config.ruler_task_args.dataset")
PIN_LABELS = {**PINNED_THINGS, "config.ruler_task_args.dataset": "RULER prompts"}
KEY_LENGTH = MetricPoint._meta.get_field("key").max_length
NAMED = 20  # ids or values a finding names at most


@dataclass
class Comparison:
    metric: str
    metrics: list[str]  # the keys the compared runs have points of: the metric choice
    runs: list[TrainingRun]
    chosen: bool  # the runs were named (?runs=); else the newest with points of the metric
    with_points: int  # unchosen: how many of the experiment's runs have points of the metric
    series: dict[int, list[tuple[int, float]]]
    best: dict[int, float]
    settings: list[tuple[str, list[str]]]  # the settings that differ: name, each run's value
    findings: list[Finding] = field(default_factory=list)

    @property
    def direction(self) -> str:
        return best_direction(self.metric)

    @property
    def following(self) -> bool:
        """Whether a compared run trains, or ended so recently that its engine may still report."""
        return any(is_live(run) or reports_open(run) for run in self.runs)

    @property
    def state(self) -> str:
        """What the comparison was drawn from (its poll's ?seen=): a run's status, a new attempt, a
        batch of points (ingest moves last_heartbeat_at) or the end of the last late-reports window
        (the answer that stops the poll) each changes it."""
        seen = [self.metric, self.following] + [[run.pk, run.status, run.attempt, str(run.last_heartbeat_at)] for run in self.runs]
        return hashlib.sha1(json.dumps(seen).encode()).hexdigest()[:12]

    def differences_of(self, index: int) -> dict[str, str]:
        """The differing settings of the `index`th compared run."""
        return {name: values[index] for name, values in self.settings}

    @property
    def without_points(self) -> list[TrainingRun]:
        """The compared runs with no points of the metric that may still report some: chosen ones, on
        the chart's legend alone."""
        return [run for run in self.runs if not self.series[run.pk] and run.status not in TERMINAL_STATUSES]

    @property
    def ended_without_points(self) -> list[TrainingRun]:
        """The compared runs that ended without points of the metric: a DISTILL run's kd_loss never
        comes from an SFT run, so none of them is waited for."""
        return [run for run in self.runs if not self.series[run.pk] and run.status in TERMINAL_STATUSES]

    def last(self, run: TrainingRun) -> float | None:
        """The run's last value: downsampling keeps a series' last point as it is."""
        points = self.series.get(run.pk)
        return points[-1][1] if points else None


def best_direction(metric: str) -> str:
    """"min" for a loss-like metric, "max" for a reward-like one, "" where neither end is better
    (learning_rate, grad_norm, a reward's spread)."""
    name = metric.lower()
    if "loss" in name or "perplexity" in name:
        return "min"
    if any(word in name for word in ("reward", "accurac", "margin")) and not any(word in name for word in ("std", "rejected")):
        return "max"
    return ""


def compare_runs(runs: QuerySet[TrainingRun], metric: str | None, run_ids: list[str], shown: list[str] | None = None) -> Comparison:
    """`runs`: the experiment's runs the reader may see. `metric`: a metric key, None for the default (default_metric);
    `run_ids`: the `runs` values given, each one or several comma-separated ids, none for the newest.
    `shown`: the page form's `shown`, the newest runs it compared by default, which its boxes send
    ticked: the same runs are no choice (a new metric compares the newest runs that report it), and
    those ticked beside them are kept before them when the limit leaves some out.
    A bad value is a finding, and the comparison falls back to the default for it."""
    runs = runs.order_by("-created_at", "-id")
    findings: list[Finding] = []
    ids = run_ids_in(run_ids, "runs", findings)
    default = run_ids_in(shown or [], "shown", findings)
    chosen = chosen_runs(runs, [] if default and set(ids) == set(default) else ids, set(default), findings)
    if metric is not None and not reported(runs, chosen, metric):
        known = metrics.metric_keys([run.pk for run in chosen]) if chosen else metric_names(runs)
        choices = f"choose one of {', '.join(known)}" if known else "none of them has metric points yet"
        whose = "chosen run" if chosen else "run of this experiment"
        findings.append(Finding("metric", f"no {whose} reports {json.dumps(metric[:KEY_LENGTH], ensure_ascii=False)}: {choices}"))
        metric = None
    metric = metric or default_metric(runs, chosen)
    with_metric = runs.filter(Exists(MetricPoint.objects.filter(run=OuterRef("pk"), key=metric)))
    compared = chosen or list(with_metric[:COMPARE_LIMIT])
    with_points = len(compared) if chosen or len(compared) < COMPARE_LIMIT else with_metric.count()
    ids = [run.pk for run in compared]
    keys = sorted(set(metrics.metric_keys(ids)) | {metric})
    series = {run.pk: chart_series(run.pk, [metric], MAX_POINTS).get(metric, []) for run in compared}
    return Comparison(metric=metric, metrics=keys, runs=compared, chosen=bool(chosen), with_points=with_points, series=series,
                      best=best_values(ids, metric), settings=differing_settings(compared), findings=findings)


def default_metric(runs: QuerySet[TrainingRun], chosen: list[TrainingRun]) -> str:
    """What a comparison charts when no metric is asked for: GRPO's reward when every run compared
    (the chosen ones, else the experiment's) is GRPO, where the loss says little of what was learned;
    the loss otherwise."""
    methods = {run.method for run in chosen} if chosen else set(runs.order_by().values_list("method", flat=True).distinct())
    return GRPO_METRIC if methods == {"grpo"} else DEFAULT_METRIC


def run_ids_in(values: list[str], name: str, findings: list[Finding]) -> list[int]:
    """The ids of the `name` values given, each one or several comma-separated, once each in their
    order; a part that is no id is a finding."""
    parts = [part.strip() for value in values for part in value.split(",") if part.strip()]
    bad = [part for part in dict.fromkeys(parts) if ascii_int(part) is None]
    findings.extend(Finding(name, f'"{part[:40]}" is not a run id: give run ids separated by commas, e.g. {name}=12,15') for part in bad[:NAMED])
    return list(dict.fromkeys(run_id for run_id in map(ascii_int, parts) if run_id is not None))


def chosen_runs(runs: QuerySet[TrainingRun], ids: list[int], before: set[int], findings: list[Finding]) -> list[TrainingRun]:
    """The runs named, newest first, at most COMPARE_LIMIT: past it those not compared `before` (just
    ticked) are kept and the oldest of the others left out. Each id that names none of `runs` (another
    experiment's, another project's, deleted) is reported by its id alone, never shown."""
    found = list(runs.filter(pk__in=[i for i in ids if i <= RUN_ID_MAX])) if ids else []
    found_ids = {run.pk for run in found}
    missing = [i for i in ids if i not in found_ids]
    if missing:
        findings.append(Finding("runs", f"no run {named(missing)} in this experiment: left out (it may have been deleted, or be another experiment's)"))
    if len(found) <= COMPARE_LIMIT:
        return found
    kept = {run.pk for run in sorted(found, key=lambda run: run.pk in before)[:COMPARE_LIMIT]}  # a stable sort: newest first on each side
    left = [run.pk for run in found if run.pk not in kept]
    why = f"the oldest of those compared before ({named(left)}) are left out to make room for the runs ticked" if before.issuperset(left) else \
        f"the oldest chosen ({named(left)}) are left out; choose fewer"
    findings.append(Finding("runs", f"at most {COMPARE_LIMIT} runs are compared at once: {why}"))
    return [run for run in found if run.pk in kept]


def named(run_ids: list[int]) -> str:
    """The first NAMED ids, and how many more: a URL can hold thousands."""
    more = f" and {len(run_ids) - NAMED} more" if len(run_ids) > NAMED else ""
    return ", ".join(f"#{run_id}" for run_id in run_ids[:NAMED]) + more


def reported(runs: QuerySet[TrainingRun], chosen: list[TrainingRun], metric: str) -> bool:
    """Whether the chosen runs (none chosen: any of the experiment's runs) have points of `metric`."""
    if len(metric) > KEY_LENGTH or "\x00" in metric:  # no key is: and PostgreSQL refuses to compare text with a NUL
        return False
    scope = [run.pk for run in chosen] if chosen else runs.values("pk")
    return MetricPoint.objects.filter(run__in=scope, key=metric).exists()


def metric_names(runs: QuerySet[TrainingRun]) -> list[str]:
    """The keys of the newest runs with points: what a reader who asked for an unknown metric can pick."""
    newest = runs.filter(Exists(MetricPoint.objects.filter(run=OuterRef("pk"))))[:COMPARE_LIMIT]
    return metrics.metric_keys([run.pk for run in newest])


def best_values(run_ids: list[int], metric: str) -> dict[int, float]:
    """Each run's best value of `metric`, over every point (a chart's points are bucket means)."""
    direction = best_direction(metric)
    if not direction or not run_ids:
        return {}
    extreme = Min("value") if direction == "min" else Max("value")
    rows = MetricPoint.objects.filter(run__in=run_ids, key=metric).values("run").annotate(best=extreme).order_by()
    return {row["run"]: row["best"] for row in rows}


def settings_of(run: TrainingRun) -> dict[str, str]:
    """A run's settings by name, as shown: method, base model, datasets, then each config and compute
    key (a nested block's keys dotted: loss.dpo_beta), values written as JSON except plain text."""
    datasets = ", ".join(entry.ref + (f" ({entry.type})" if entry.type else "") for entry in dataset_entries(run.dataset))
    shown = {"method": run.get_method_display(), "base_model": run.base_model or NOT_SET, "dataset": datasets or NOT_SET}
    shown.update(flattened(run.config or {}, ""))
    shown.update(flattened(run.compute or {}, "compute."))
    return shown


def flattened(block: dict[str, Any], prefix: str) -> dict[str, str]:
    shown: dict[str, str] = {}
    for key, value in block.items():
        if isinstance(value, dict) and value:
            shown.update(flattened(value, f"{prefix}{key}."))
        else:
            shown[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return shown


def pins_of(run: TrainingRun) -> dict[str, str]:
    """What the run really trained on, by pinned field (base_model, dataset[1], config.environment_id):
    each Data Hub ref with the commit START pinned it to ("sci-ui@main → commit 28060f47a1b2"). Two
    runs of the same `repo@main` differ here once the branch moved between their STARTs, though every
    setting matches. The commit is cut to 12 characters, as the run's log names it (datahub.refs.trained_from)."""
    return {field.removesuffix(".ref"): f"{pin.get('ref') or pin.get('repo')} → commit {str(pin['commit'])[:12]}"
            for field, pin in (run.pinned or {}).items() if isinstance(pin, dict) and pin.get("commit")}


def pin_place(field: str) -> tuple[int, int, str]:
    """Where a pinned field's row goes: in PIN_ORDER, a dataset's entries by their index."""
    base = re.sub(r"\[\d+\]$", "", field)
    index = re.search(r"\[(\d+)\]$", field)
    return (PIN_ORDER.index(base) if base in PIN_ORDER else len(PIN_ORDER), int(index[1]) if index else -1, field)


def pin_label(field: str) -> str:
    """A pinned field's row name: `dataset[1]` → "dataset[1] commit", `config.environment_id` →
    "environment commit"."""
    base = re.sub(r"\[\d+\]$", "", field)
    return f"{PIN_LABELS.get(base, base)}{field[len(base):]} commit"


def never_started(run: TrainingRun) -> bool:
    """No START yet: nothing was pinned, and its refs resolve only when it starts."""
    return not run.pinned and not run.attempt and run.start_requested_at is None


def differing_settings(runs: list[TrainingRun]) -> list[tuple[str, list[str]]]:
    """The settings whose value is not the same in every run (one a run lacks shows as "—"):
    method, base model and dataset first, then the commits their refs were pinned to, then the rest
    by name. A pinned commit differs only between runs that pinned one: a run not started yet has
    nothing pinned (its refs resolve when it starts), which is no difference, and a run whose field
    is no Data Hub ref differs in the field itself, a row of its own."""
    each = [settings_of(run) for run in runs]
    names = list(dict.fromkeys(name for shown in each for name in shown))
    fixed = ["method", "base_model", "dataset"]
    rows = [(name, [shown.get(name, NOT_SET) for shown in each]) for name in fixed]
    rows = [(name, values) for name, values in rows if len(set(values)) > 1]
    pins = [pins_of(run) for run in runs]
    for pin in sorted({pin for pinned in pins for pin in pinned}, key=pin_place):
        if len({pinned[pin] for pinned in pins if pin in pinned}) > 1:
            rows.append((pin_label(pin), [pinned.get(pin, NOT_PINNED if never_started(run) else NOT_SET) for run, pinned in zip(runs, pins, strict=True)]))
    rest = [(name, [shown.get(name, NOT_SET) for shown in each]) for name in sorted(set(names) - set(fixed))]
    return rows + [(name, values) for name, values in rest if len(set(values)) > 1]
