"""The docs say what the code does: every field of the CRD, every status reason, phase, condition, exit
code, injected variable and printer column is in docs/reference.md (the reasons in docs/troubleshooting.md
too, with what to do), and the trainer runtime's README documents every environment variable and exit code
of the contract."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from ddp_contract import envnames
from ddp_contract.exitcodes import ExitCode
from ddp_operator import constants as c
from ddp_operator.kubelet import WAITING_REASONS
from ddp_operator.manifests import rank_env
from ddp_operator.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
TRAINER_README = (REPO / "images" / "trainer" / "README.md").read_text()
REFERENCE = (REPO / "docs" / "reference.md").read_text()
TROUBLESHOOTING = (REPO / "docs" / "troubleshooting.md").read_text()
USER_GUIDE = (REPO / "docs" / "user-guide.md").read_text()
CRD = yaml.safe_load((REPO / "crds" / "ddpjob.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]["properties"]


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def quoted(text: str) -> set[str]:
    """Everything the text writes as code: `...`."""
    return set(re.findall(r"`([^`\n]+)`", text))


def field_paths(schema: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every property under `schema` as a dotted path, array items written `name[]`: `s3.endpoint`,
    `template.spec.containers[].image`."""
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}{name}"
        yield path
        if sub.get("type") == "array":
            yield from field_paths(sub.get("items") or {}, f"{path}[].")
        else:
            yield from field_paths(sub, f"{path}.")


def reason_constants() -> dict[str, str]:
    return {key: value for key, value in vars(c).items() if key.startswith("REASON_") and isinstance(value, str)}


# --- the trainer runtime's README ----------------------------------------------------------------------

def test_every_environment_variable_is_in_the_trainer_readme_s_environment_table() -> None:
    table = section(TRAINER_README, "Environment")
    names = [value for key, value in vars(envnames).items() if key.isupper() and isinstance(value, str)]
    assert [name for name in names if not re.search(rf"\b{name}\b", table)] == []


def test_every_exit_code_is_in_the_trainer_readme_s_table() -> None:
    rows = {(int(cells[1]), cells[2]) for line in TRAINER_README.splitlines()
            if line.startswith("| ") and (cells := [c.strip() for c in line.split("|")])[1].isdigit()}
    assert {(int(code), code.name) for code in ExitCode} <= rows


def test_the_user_guide_s_runtime_summary_names_the_retried_exit_codes() -> None:
    retried = sorted(code for code in ExitCode if code >= 200)
    assert f"{retried[0]}-{retried[-1]}" in section(USER_GUIDE, "Writing a training function")


# --- docs/reference.md -----------------------------------------------------------------------------------

def test_every_spec_field_of_the_crd_is_in_the_reference() -> None:
    documented = quoted(section(REFERENCE, "The spec"))
    paths = list(field_paths(SCHEMA["spec"]))
    assert len(paths) > 40  # the walk found the nested fields (s3.*, template.spec.*, ...)
    assert [path for path in paths if path not in documented] == []


def test_every_status_field_of_the_crd_is_in_the_reference() -> None:
    documented = quoted(section(REFERENCE, "The status"))
    paths = list(field_paths(SCHEMA["status"]))
    assert "failedRank.exitCode" in paths and "progress.stepSeconds" in paths
    assert [path for path in paths if path not in documented] == []


def test_every_phase_and_condition_is_in_the_reference() -> None:
    phases = quoted(section(REFERENCE, "Phases"))
    conditions = quoted(section(REFERENCE, "Conditions and Events"))
    assert set(c.PHASES) == set(SCHEMA["status"]["properties"]["phase"]["enum"])
    assert [phase for phase in c.PHASES if phase not in phases] == []
    types = [value for key, value in vars(c).items() if key.startswith("COND_")]
    assert [kind for kind in types if kind not in conditions] == []


def all_reasons() -> set[str]:
    """Every reason the operator writes: its own (constants.py REASON_*) and the kubelet's it maps (kubelet.py)."""
    reasons = {*reason_constants().values(), *WAITING_REASONS.values()}
    assert len(reasons) > 30
    return reasons


def test_every_reason_the_operator_writes_is_in_the_reference() -> None:
    text = quoted(section(REFERENCE, "Reasons"))
    assert sorted(reason for reason in all_reasons() if reason not in text) == []


# Reasons that need nothing done: the job is fine (or they name a condition, or a failed rank's reason).
NOTHING_TO_DO = {c.REASON_WAITING, c.REASON_ALL_READY, c.REASON_SUCCEEDED, c.REASON_CREATED, c.REASON_NOT_BLOCKED,
                 c.REASON_RANK_MISSING, c.REASON_DATA_WORKERS_READY, c.REASON_DATA_WORKERS_STARTING,
                 c.REASON_DATA_WORKERS_NOT_KEPT, c.REASON_FULL_SIZE}


def test_every_reason_has_a_section_in_the_troubleshooting_guide_saying_what_to_do() -> None:
    headings = set(re.findall(r"^### (\S+)$", TROUBLESHOOTING, flags=re.MULTILINE))
    assert sorted(reason for reason in all_reasons() - NOTHING_TO_DO if reason not in headings) == []
    assert sorted(reason for reason in NOTHING_TO_DO if reason not in quoted(TROUBLESHOOTING)) == []


def test_every_failed_rank_reason_of_the_runtime_is_in_the_reference_and_the_troubleshooting_guide() -> None:
    reasons = {*c.RUNTIME_EXIT_REASONS.values(), c.REASON_NODE_LOST, c.REASON_RANK_MISSING, "OOMKilled", "Error"}
    status = quoted(section(REFERENCE, "The status"))
    table = quoted(section(TROUBLESHOOTING, "A failed rank's exit reason"))
    assert sorted(reason for reason in reasons if reason not in status or reason not in table) == []


def test_every_exit_code_is_in_the_reference_s_table() -> None:
    rows = {(int(cells[1]), cells[2]) for line in section(REFERENCE, "Exit codes").splitlines()
            if line.startswith("| ") and (cells := [c.strip() for c in line.split("|")])[1].isdigit()}
    assert {(int(code), code.name) for code in ExitCode} <= rows


def test_every_variable_the_operator_injects_is_in_the_reference() -> None:
    table = quoted(section(REFERENCE, "The environment of a rank"))
    s3 = {"endpoint": "http://s3:9000", "region": "r", "credentialsSecret": "s", "dataset": "s3://d/x", "results": "s3://r/x"}
    job = {"metadata": {"name": "train", "namespace": "ns", "uid": "u"},
           "status": {"lastCheckpoint": {"uri": "s3://r/x/ns/train/checkpoints/step-000000000001"}}}
    injected = set()
    for per_pod in (1, 2):
        spec = parse_spec({"worldSize": 4, "ranksPerPod": per_pod, "image": "i", "entrypoint": "m:f",
                           "hangTimeoutSeconds": 60, "s3": s3})
        injected |= {item["name"] for item in rank_env(job, spec, 0, 0)}
    assert sorted(name for name in injected if name not in table) == []


def test_every_printer_column_is_in_the_reference() -> None:
    table = section(REFERENCE, "kubectl get columns")
    columns = ["NAME", *(column["name"].upper() for column in VERSION["additionalPrinterColumns"])]
    header = next(line.split() for line in table.splitlines() if line.strip().startswith("NAME "))
    wide = [column["name"].upper() for column in VERSION["additionalPrinterColumns"] if column.get("priority")]
    assert header == [column for column in columns if column not in wide]
    assert [column for column in columns if column not in quoted(table)] == []
