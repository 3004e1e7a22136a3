"""deploy/prometheus: Prometheus's own ``promtool`` accepts the rules and the scrape config, the
unit tests of every alert pass, and every alert has a test that fires it and one where it is
quiet (issue 16: "promtool on the rules with unit tests for each alert")."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

TOP = Path(__file__).resolve().parents[3]
PROM = TOP / "deploy" / "prometheus"
REQUIRED = {
    "DispatchObserverUnreachable",
    "DispatchEscalationsUndelivered",
    "DispatchSupervisorDown",
    "DispatchPassesFailing",
    "DispatchConflictStorm",
}


def _promtool(promtool: str, *args: str) -> str:
    done = subprocess.run(
        [promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _alerts() -> set[str]:
    rules: dict[str, Any] = yaml.safe_load((PROM / "dispatch.rules.yml").read_text())
    return {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_promtool_checks_the_rules_and_the_scrape_config(promtool: str) -> None:
    assert f"SUCCESS: {len(_alerts())} rules found" in _promtool(
        promtool, "check", "rules", "dispatch.rules.yml"
    )
    assert "is valid prometheus config file syntax" in _promtool(
        promtool, "check", "config", "prometheus.yml"
    )


def test_promtool_unit_tests_of_every_alert_pass(promtool: str) -> None:
    assert "SUCCESS" in _promtool(promtool, "test", "rules", "dispatch.rules.test.yml")


def test_promtool_test_rules_fails_a_wrong_expectation(promtool: str, tmp_path: Path) -> None:
    """The unit tests are not vacuous: an alert expected where none fires is a failure."""
    (tmp_path / "dispatch.rules.yml").write_text((PROM / "dispatch.rules.yml").read_text())
    (tmp_path / "wrong.test.yml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["dispatch.rules.yml"],
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [
                            {"series": 'up{job="dispatch-supervisor"}', "values": "1 1 1 1 1"}
                        ],
                        "alert_rule_test": [
                            {
                                "eval_time": "4m",
                                "alertname": "DispatchSupervisorDown",
                                "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                            }
                        ],
                    }
                ],
            }
        )
    )
    done = subprocess.run(
        [promtool, "test", "rules", "wrong.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    assert "DispatchSupervisorDown" in done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alerts = _alerts()
    assert alerts >= REQUIRED
    tests: dict[str, Any] = yaml.safe_load((PROM / "dispatch.rules.test.yml").read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == alerts, f"alerts never shown firing: {alerts - firing}"
    assert quiet == alerts, f"alerts never shown quiet: {alerts - quiet}"
