"""The job's status named once: ddp_contract.jobstatus against the CRD's status schema and what the
operator writes."""

from __future__ import annotations

from typing import Any

import yaml

from ddp_contract import jobstatus
from ddp_operator.statuspatch import OWNED_STATUS
from kube import REPO

STATUS_SCHEMA: dict[str, Any] = yaml.safe_load((REPO / "crds" / "ddpjob.yaml").read_text())[
    "spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
KEYS = {name: value for name, value in vars(jobstatus).items() if name.startswith("STATUS_")}


def test_every_status_field_of_the_crd_has_one_name_and_every_name_a_field() -> None:
    assert sorted(KEYS.values()) == sorted(set(KEYS.values())), "two names for one field"
    assert set(KEYS.values()) == set(STATUS_SCHEMA) - {"kopf"}  # kopf's own field is kopf's


def test_the_patch_type_covers_exactly_what_the_operator_owns() -> None:
    assert set(jobstatus.StatusPatch.__annotations__) == OWNED_STATUS
    assert OWNED_STATUS <= set(KEYS.values())


def test_the_phases_are_the_crd_s_and_the_finished_ones_among_them() -> None:
    assert jobstatus.PHASES == tuple(STATUS_SCHEMA["phase"]["enum"])
    assert jobstatus.TERMINAL_PHASES == {jobstatus.PHASE_SUCCEEDED, jobstatus.PHASE_FAILED}


def test_each_reason_and_condition_type_is_one_camel_case_word() -> None:
    words = {name: value for name, value in vars(jobstatus).items() if name.startswith(("REASON_", "COND_", "KIND_"))}
    assert [name for name, value in words.items() if not (value[:1].isupper() and value.isalnum())] == []
