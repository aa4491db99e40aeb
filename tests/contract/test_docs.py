"""The trainer runtime's README documents every environment variable and exit code of the contract."""

from __future__ import annotations

import re
from pathlib import Path

from ddp_contract import envnames
from ddp_contract.exitcodes import ExitCode

REPO = Path(__file__).resolve().parents[2]
TRAINER_README = (REPO / "images" / "trainer" / "README.md").read_text()


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_environment_variable_is_in_the_trainer_readme_s_environment_table() -> None:
    table = section(TRAINER_README, "Environment")
    names = [value for key, value in vars(envnames).items() if key.isupper() and isinstance(value, str)]
    assert [name for name in names if not re.search(rf"\b{name}\b", table)] == []


def test_every_exit_code_is_in_the_trainer_readme_s_table() -> None:
    rows = {(int(cells[1]), cells[2]) for line in TRAINER_README.splitlines()
            if line.startswith("| ") and (cells := [c.strip() for c in line.split("|")])[1].isdigit()}
    assert {(int(code), code.name) for code in ExitCode} <= rows


def test_the_readme_s_runtime_summary_names_the_retried_exit_codes() -> None:
    retried = sorted(code for code in ExitCode if code >= 200)
    assert f"{retried[0]}-{retried[-1]}" in (REPO / "README.md").read_text()
