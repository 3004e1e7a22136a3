"""Every metric the Grafana dashboard and the Prometheus rules query is one the services really
export: the names come from each service's own metrics registry (``services/*/metrics.py``),
built here as the service builds it, never from a list kept by hand (issue 16)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from services.api.metrics import ApiMetrics
from services.notifier.metrics import NotifierMetrics
from services.observer.metrics import ObserverMetrics
from services.supervisor.metrics import SupervisorMetrics

TOP = Path(__file__).resolve().parents[3]
DASHBOARD = TOP / "deploy" / "grafana" / "dispatch.json"
RULES = TOP / "deploy" / "prometheus" / "dispatch.rules.yml"

PROMETHEUS_OWN = {"up"}
"""Series Prometheus itself makes for every scrape target."""

# What a metric family of each type exposes (prometheus_client's text format, OpenMetrics off).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip


def exported() -> dict[str, set[str]]:
    """The series names each service exports, from its metrics registry."""
    registries: dict[str, CollectorRegistry] = {}
    for service in ("api", "supervisor", "notifier", "observer"):
        registries[service] = CollectorRegistry()
    ApiMetrics(registries["api"])
    SupervisorMetrics(registries["supervisor"])
    NotifierMetrics(registries["notifier"], undelivered=lambda: 0.0, oldest_age_s=lambda: 0.0)
    ObserverMetrics(registries["observer"], "slurm")
    names: dict[str, set[str]] = {}
    for service, registry in registries.items():
        names[service] = {
            family.name + suffix
            for family in registry.collect()
            for suffix in _SUFFIXES[family.type]
        }
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Strings, label matchers, ranges and grouping clauses are removed first; what is left that
    looks like a name and is not a function call, a keyword or a number is a metric.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def _dashboard_queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key in ("query", "definition") and isinstance(value, str):
                yield from _label_values_metric(value)
            else:
                yield from _dashboard_queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_queries(item)


def _label_values_metric(query: str) -> Iterator[str]:
    """Grafana's ``label_values(<selector>, <label>)``: the selector is a query."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    if match:
        yield match.group(1)


def dashboard_queries() -> list[str]:
    return list(_dashboard_queries(json.loads(DASHBOARD.read_text())))


def rule_queries() -> list[str]:
    rules: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_the_parser_finds_metric_names_and_only_them() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (cluster, le) (rate(a_bucket{job="x", le=~"$c"}'
        "[$__rate_interval]))) / on (cluster) group_left max(b) or vector(0) + up > bool 2"
    )
    assert metric_names(expr) == {"a_bucket", "b", "up"}
    assert metric_names('absent(up{job="dispatch-supervisor"} == 1)') == {"up"}


def test_the_registries_give_each_type_its_series_names() -> None:
    names = exported()
    assert "dispatch_supervisor_passes_total" in names["supervisor"]
    assert "dispatch_supervisor_pass_duration_seconds_bucket" in names["supervisor"]
    assert "dispatch_notifier_undelivered" in names["notifier"]
    assert "dispatch_observer_scheduler_reachable" in names["observer"]
    assert "dispatch_api_command_conflicts_total" in names["api"]


@pytest.mark.parametrize(
    ("source", "queries"),
    [("dashboard", dashboard_queries), ("rules", rule_queries)],
)
def test_every_metric_queried_is_exported(source: str, queries: Any) -> None:
    names = exported()
    every = set().union(*names.values()) | PROMETHEUS_OWN
    asked = [(q, metric_names(q)) for q in queries()]
    assert asked, source
    missing = {(m, q) for q, ms in asked for m in ms if m not in every}
    assert not missing, f"{source} queries metrics no service exports: {sorted(missing)}"
    # Each query selects something (a query the parser reads as empty would prove nothing).
    assert all(ms for _, ms in asked), [q for q, ms in asked if not ms]


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    """Jobs by state, recoveries, escalations undelivered, pass latency, observer reachability
    and poll time, conflicts: each has a panel querying the service's metric."""
    panels = {
        p["title"]: " ".join(t["expr"] for t in p.get("targets", []))
        for p in json.loads(DASHBOARD.read_text())["panels"]
    }
    wanted = {
        "Jobs by state": "dispatch_supervisor_jobs",
        "Launches by outcome; recoveries by cause": "dispatch_supervisor_launches_total",
        "Escalations undelivered": "dispatch_notifier_undelivered",
        "Oldest undelivered escalation": "dispatch_notifier_oldest_undelivered_age_seconds",
        "Pass latency": "dispatch_supervisor_pass_duration_seconds_bucket",
        "Scheduler reachable": "dispatch_observer_scheduler_reachable",
        "Poll time": "dispatch_observer_poll_duration_seconds_bucket",
        "Conflicts": "dispatch_supervisor_conflicts_total",
    }
    for title, metric in wanted.items():
        assert metric in metric_names(panels[title]), title
    recoveries = panels["Launches by outcome; recoveries by cause"]
    assert "dispatch_supervisor_recoveries_total" in metric_names(recoveries)
