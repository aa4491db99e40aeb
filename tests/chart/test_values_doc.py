"""charts/README.md lists every value the chart takes (no cluster needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts"
# Values documented as one row (their keys are Kubernetes' own, or labels).
WHOLE = {"resources", "grafana.dashboard.labels"}


def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and dotted not in WHOLE:
            keys.extend(leaves(value, f"{dotted}."))
        else:
            keys.append(dotted)
    return keys


def test_every_value_has_a_row_in_the_charts_readme() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = {line.split("|")[1].strip().strip("`") for line in (CHART / "README.md").read_text().splitlines()
            if line.startswith("| `")}
    assert [key for key in leaves(values) if key not in rows] == []
