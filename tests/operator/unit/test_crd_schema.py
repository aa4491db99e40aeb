"""The CRD YAML and the Python side agree (offline: no API server needed)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_contract import api, backend, envnames, labels
from ddp_contract.jobspec import (
    DEFAULT_BACKEND,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_GPUS_PER_RANK,
    DEFAULT_MASTER_PORT,
    DEFAULT_NODE_LOST_GRACE_SECONDS,
    DEFAULT_RESTART_POLICY,
    DEFAULT_STARTUP_DEADLINE_SECONDS,
    RESTART_POLICIES,
)
from ddp_operator import constants as c
from ddp_operator.decision import Action, Decision
from ddp_operator.failures import RankFailure
from ddp_operator.podsummary import summarize_pods
from ddp_operator.spec import MAX_GPUS_PER_RANK, MAX_SECONDS, MAX_WORLD_SIZE, InvalidSpec, parse_spec
from ddp_operator.statuspatch import compute_status, invalid_spec_status
from kube import REPO

CRD_PATH = REPO / "crds" / "ddpjob.yaml"
EXAMPLES = sorted((REPO / "examples").glob("ddpjob*.yaml"))
NOW = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_names_match_constants(crd: dict[str, Any]) -> None:
    assert crd["metadata"]["name"] == api.CRD_NAME
    assert crd["spec"]["group"] == api.GROUP and crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["singular"]) == (api.KIND, api.PLURAL, api.SINGULAR)
    assert names["shortNames"] == [api.SHORT_NAME]
    version = crd["spec"]["versions"][0]
    assert version["name"] == api.VERSION and version["storage"] and version["subresources"] == {"status": {}}


def test_defaults_and_enums_match_constants(crd: dict[str, Any]) -> None:
    spec = schema(crd)["properties"]["spec"]["properties"]
    assert spec["masterPort"]["default"] == DEFAULT_MASTER_PORT
    assert spec["backoffLimit"]["default"] == DEFAULT_BACKOFF_LIMIT
    assert spec["startupDeadlineSeconds"]["default"] == DEFAULT_STARTUP_DEADLINE_SECONDS
    assert spec["nodeLostGraceSeconds"]["default"] == DEFAULT_NODE_LOST_GRACE_SECONDS
    assert spec["gpusPerRank"]["default"] == DEFAULT_GPUS_PER_RANK
    assert spec["backend"]["default"] == DEFAULT_BACKEND and tuple(spec["backend"]["enum"]) == backend.BACKENDS
    assert spec["restartPolicy"]["default"] == DEFAULT_RESTART_POLICY
    assert tuple(spec["restartPolicy"]["enum"]) == RESTART_POLICIES
    assert spec["worldSize"]["maximum"] == MAX_WORLD_SIZE
    assert spec["gpusPerRank"]["maximum"] == MAX_GPUS_PER_RANK
    assert tuple(schema(crd)["properties"]["status"]["properties"]["phase"]["enum"]) == c.PHASES


def test_reserved_env_rule_lists_every_reserved_name(crd: dict[str, Any]) -> None:
    rule = schema(crd)["properties"]["spec"]["properties"]["env"]["x-kubernetes-validations"][0]["rule"]
    for name in envnames.RESERVED:
        assert f"'{name}'" in rule


def test_reserved_label_rule_lists_every_reserved_label(crd: dict[str, Any]) -> None:
    field = schema(crd)["properties"]["spec"]["properties"]["template"]["properties"]["metadata"]["properties"][
        "labels"
    ]
    for label in labels.RESERVED_LABELS:
        assert f"'{label}'" in field["x-kubernetes-validations"][0]["rule"]


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = {col["name"]: col["jsonPath"] for col in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase" and columns["Ready"] == ".status.ready"
    assert columns["Restarts"] == ".status.restarts" and columns["Age"] == ".metadata.creationTimestamp"
    assert (columns["Epoch"], columns["Step"], columns["Loss"]) == (
        ".status.progress.epoch",
        ".status.progress.step",
        ".status.progress.loss",
    )


def undeclared(value: Any, node: dict[str, Any], path: str) -> list[str]:
    """Paths in value that a structural schema would prune."""
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        return [
            p for key, item in value.items() for p in undeclared(item, node["additionalProperties"], f"{path}.{key}")
        ]
    if isinstance(value, dict):
        props = node.get("properties", {})
        missing = [f"{path}.{key}" for key in value if key not in props]
        return missing + [
            p for key, item in value.items() if key in props for p in undeclared(item, props[key], f"{path}.{key}")
        ]
    if isinstance(value, list):
        return [p for item in value for p in undeclared(item, node.get("items", {}), f"{path}[]")]
    return []


def status_patches() -> list[dict[str, Any]]:
    spec = parse_spec({"worldSize": 2, "image": "x", "entrypoint": "a:b"})
    summary = summarize_pods([], 0, job_name="job")
    failure = RankFailure(1, "job-1", 137, "OOMKilled", False)
    decisions = [
        Decision(Action.CREATE, 0, create_indices=(0, 1)),
        Decision(Action.RESTART, 1, "RankFailed", "m", failure=failure),
        Decision(Action.FAIL, 0, "PermanentFailure", "m", failure=failure),
        Decision(Action.SUSPEND, 0, "Suspended", "m"),
    ]
    patches = [compute_status(spec, status={}, summary=summary, decision=decision, now=NOW, generation=1)
               for decision in decisions]
    patches.append(invalid_spec_status(InvalidSpec("worldSize", "bad"), {}, NOW, 1))
    return patches


def test_every_status_field_the_operator_writes_is_declared(crd: dict[str, Any]) -> None:
    status_schema = schema(crd)["properties"]["status"]
    written = [{k: v for k, v in patch.items() if v is not None} for patch in status_patches()]
    assert [undeclared(patch, status_schema, "status") for patch in written] == [[]] * len(written)


def test_kopf_and_progress_are_kept(crd: dict[str, Any]) -> None:
    status = schema(crd)["properties"]["status"]["properties"]
    assert status["kopf"]["x-kubernetes-preserve-unknown-fields"] is True
    assert set(status["progress"]["properties"]) >= {"epoch", "step", "loss", "samplesPerSecond", "updatedAt"}


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"ddpjob-minimal.yaml", "ddpjob-gpu.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_parse_and_match_the_schema(path: Path, crd: dict[str, Any]) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc.get("kind") != api.KIND:
            continue
        assert doc["apiVersion"] == api.API_VERSION
        parse_spec(doc["spec"])
        assert undeclared(doc["spec"], schema(crd)["properties"]["spec"], "spec") == []


def integer_fields(node: dict[str, Any], path: str = "spec") -> list[tuple[str, dict[str, Any]]]:
    """Every integer (or number) field under the spec schema, nested ones too, by its path."""
    found = [(path, node)] if node.get("type") in ("integer", "number") else []
    for key, child in (node.get("properties") or {}).items():
        found += integer_fields(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += integer_fields(node[key], f"{path}[]" if key == "items" else f"{path}.*")
    return found


def test_every_integer_of_the_spec_is_bounded_within_int32(crd: dict[str, Any]) -> None:
    """The operator holds any value the schema lets through: each integer has a minimum and a maximum
    that fit an int32, as the pod fields some of them end up in do."""
    fields = integer_fields(schema(crd)["properties"]["spec"])
    assert {"spec.activeDeadlineSeconds", "spec.dataWorkers.replicas"} <= {path for path, _ in fields}
    unbounded = [path for path, node in fields if node.get("type") != "integer" or "minimum" not in node
                 or not 0 <= node.get("maximum", 2**31) <= MAX_SECONDS]
    assert unbounded == []


# What each bounded field needs beside it for its maximum to be valid (ranksPerPod divides worldSize, ...).
AT_MAXIMUM: dict[str, dict[str, Any]] = {
    "ranksPerPod": {"worldSize": 64},
    "minWorldSize": {"worldSize": 65536},
    "sparePods": {"restartStrategy": "InPlace"},
}


@pytest.mark.parametrize("path", [path for path, _ in integer_fields(
    schema(yaml.safe_load(CRD_PATH.read_text()))["properties"]["spec"]) if not path.startswith("spec.template.")])
def test_parse_spec_takes_each_integer_s_crd_maximum_and_refuses_one_more(crd: dict[str, Any], path: str) -> None:
    """parse_spec repeats the CRD's bounds (for objects stored under an older CRD): the maximum is taken,
    one more is refused naming the field."""
    node = dict(integer_fields(schema(crd)["properties"]["spec"]))[path]
    field = path.removeprefix("spec.")

    def spec_with(value: int) -> dict[str, Any]:
        top, _, nested = field.partition(".")
        spec = {"worldSize": 2, "image": "x", "entrypoint": "a:b", "gpusPerRank": 0, **AT_MAXIMUM.get(field, {})}
        spec[top] = {nested: value} if nested else value
        return spec

    parse_spec(spec_with(node["maximum"]))
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(spec_with(node["maximum"] + 1))
    assert refused.value.field == field, refused.value


# The OpenAPI v3 keywords a structural CRD schema uses (apiextensions.k8s.io/v1 JSONSchemaProps).
SCHEMA_KEYWORDS = {
    "type", "description", "properties", "items", "additionalProperties", "format", "enum", "default",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties", "required", "nullable",
    "anyOf", "allOf", "oneOf", "not", "title", "example",
}


def schemas_under(node: dict[str, Any], path: str) -> list[tuple[str, Any]]:
    """Every (path, schema) from `node` down: its properties, items and additionalProperties."""
    found: list[tuple[str, Any]] = [(path, node)]
    children = [(f"{path}.{name}", child) for name, child in (node.get("properties") or {}).items()]
    children += [(f"{path}[]", node[key]) for key in ("items", "additionalProperties") if isinstance(node.get(key), dict)]
    for child_path, child in children:
        found += schemas_under(child, child_path) if isinstance(child, dict) else [(child_path, child)]
    return found


def test_every_schema_of_the_crd_has_only_schema_keywords(crd: dict[str, Any]) -> None:
    """A comma in an unquoted description of a flow mapping ({type: string, description: a, b}) makes a
    key ` b` beside the schema's keywords: the API server keeps quiet on create, but `kubectl apply`
    (strict field validation) refuses the whole CRD."""
    for path, node in schemas_under(schema(crd), "openAPIV3Schema"):
        assert isinstance(node, dict), f"{path} is {node!r}, not a schema"
        unknown = {key for key in node if key not in SCHEMA_KEYWORDS and not key.startswith("x-kubernetes-")}
        assert not unknown, f"{path} has {sorted(unknown)}, not schema keywords: quote its description"
