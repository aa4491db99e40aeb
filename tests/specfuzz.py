"""Seeded random mutations of valid DDPJob specs: missing fields, wrong types, extreme numbers, odd and huge
strings, unicode, nulls, odd pod templates. The same seed gives the same specs, so a failing one is made
again from the seed and its index (tests/operator/unit/test_spec_fuzz.py runs them through the operator's
pure functions, tests/operator/cluster/test_spec_fuzz.py against the API server and the operator).

DDP_FUZZ_SEED and DDP_FUZZ_COUNT choose the seed and how many specs a run makes.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specs import FULL_TEMPLATE

SEED_ENV = "DDP_FUZZ_SEED"
COUNT_ENV = "DDP_FUZZ_COUNT"
DEFAULT_SEED = 46
CRD_FILE = Path(__file__).resolve().parent.parent / "crds" / "ddpjob.yaml"

# Numbers at and past every bound that matters: int32, JSON's exact integers, int64, beyond; fractions.
NUMBERS: tuple[Any, ...] = (0, -1, 1, 3, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**40, 2**53 + 1, 2**63 - 1, 2**63,
                            2**64, -(2**31), -(2**63), 10**30, 0.5, -2.5, 1e300, 1.0)
STRINGS: tuple[str, ...] = (
    "", " ", "0", "-1", "1e999999999", "9Ei", "-8Gi", "0.000000001n", "8Gi", "Ki", "null", "true", "None",
    "训练任务", "ﾃｽﾄ", "🚀🔥", "\u202eevil", "a\nb", "\t", "nul\u0000byte", "$(reboot)", "{{ .Values.x }}", "${HOME}",
    "%s%s%n", "../../etc/passwd", "/", "s3://", "s3://b/p", "http://", "https://s3.example.com", "train:main",
    "a:b:c", "Trainer", "trainer", "dshm", "x" * 300,
)
HUGE = ("é" * 100_000, "y" * 300_000)  # past most maxLengths; within the API server's request size
WRONG_TYPES: tuple[Any, ...] = ({}, [], [1], [None], {"a": 1}, {"": ""}, True, False, None, [[]], {"name": None})
# Values a pod template (kept as written by the CRD, x-kubernetes-preserve-unknown-fields) may carry.
POD_FIELDS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("terminationGracePeriodSeconds", (-1, 0, 2**31, 2**63 - 1, 2**64, "30")),
    ("activeDeadlineSeconds", (0, 2**31, 2**40)),
    ("priority", (2**31, -1)),
    ("hostNetwork", ("yes", 1)),
    ("tolerations", ([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                       "tolerationSeconds": 2**63}], [{"tolerationSeconds": "x"}], [{"key": 5, "operator": []}],
                     ["x"], [None])),
    ("nodeSelector", ({"k": 5}, {"": ""}, ["a"])),
    ("volumes", ([{"name": "v", "emptyDir": {"sizeLimit": "1e999999999"}}], [{"name": "a" * 64}],
                 [{"name": "dshm", "emptyDir": {}}], [{"emptyDir": {}}], ["v"])),
    ("containers", ([{"name": "trainer", "env": [{"name": "RANK", "value": "0"}]}],
                    [{"name": "trainer", "env": "x"}], [{"name": "trainer", "ports": [{"containerPort": 2**31}]}],
                    [{"name": "side", "image": "busybox", "resources": {"requests": {"cpu": "1e999999999"}}}],
                    [{"name": "side", "image": "busybox", "resources": {"limits": [1]}}],
                    [{"name": "side", "image": "busybox", "resources": "lots"}],
                    [{"name": "trainer", "volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}]}],
                    [{"name": "trainer", "volumeMounts": "x"}], [{"name": "trainer", "securityContext": "x"}],
                    [{"name": "trainer"}, {"name": "trainer"}], [{"name": 5, "image": "x"}], [{}], ["trainer"])),
    ("initContainers", ([{"name": "init", "image": "busybox", "restartPolicy": "Always"}], [{"name": 5, "image": "x"}],
                        [{"name": "init", "image": "busybox", "resources": {"requests": {"cpu": []}}}], ["x"])),
    ("securityContext", ({"runAsUser": -1}, {"runAsUser": 2**63}, {"sysctls": [{"name": "x"}]}, [], "x")),
    ("restartPolicy", ("Always", "Never", 5)),
    ("serviceAccountName", ("Not_Valid", "a" * 300)),
    ("imagePullSecrets", ([{"name": 5}], ["x"], [{}])),
    ("affinity", ({"nodeAffinity": "x"}, [])),
    ("dnsConfig", ({"options": [{"name": "ndots", "value": 5}]},)),
    ("overhead", ({"cpu": "-1"},)),
)
MAP_KEYS = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "x", "", "ключ", "a" * 300, "team")


def runnable_template() -> dict[str, Any]:
    """FULL_TEMPLATE less what a test cluster lacks (a PriorityClass, another scheduler, the claim) and its
    affinity with no terms, which a pod may not have: its pods run, unless a mutation says otherwise."""
    template = copy.deepcopy(FULL_TEMPLATE)
    for key in ("priorityClassName", "schedulerName", "affinity"):
        del template["spec"][key]
    template["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    return template


def base_specs() -> list[dict[str, Any]]:
    """Valid specs, one of each kind of job: an entrypoint, a command with a full template, S3 and env, an
    elastic job restarted in place, data workers with kept folders and a topology, a pod of several ranks
    with deadlines."""
    return [
        {"worldSize": 2, "image": "trainer:test", "entrypoint": "train.main:run", "gpusPerRank": 0},
        {"worldSize": 2, "image": "trainer:test", "command": ["python", "train.py"], "args": ["--epochs", "1"],
         "gpusPerRank": 0, "template": runnable_template(), "shmSize": "1Gi",
         "resources": {"limits": {"cpu": 2, "memory": "4Gi"}, "requests": {"cpu": "500m"}},
         "env": [{"name": "LR", "value": "0.1"}], "envFrom": [{"configMapRef": {"name": "cfg"}}],
         "imagePullSecrets": [{"name": "regcred"}],
         "s3": {"endpoint": "http://s3.local:8333", "region": "r", "credentialsSecret": "creds", "dataset": "s3://d/x",
                "results": "s3://r/x", "checksums": "WhenRequired", "addressingStyle": "Path",
                "caBundle": {"configMap": "ca", "key": "ca.crt"}}},
        {"worldSize": 4, "minWorldSize": 2, "restartStrategy": "InPlace", "image": "trainer:test",
         "entrypoint": "train.main:run", "gpusPerRank": 0, "elasticSettleSeconds": 5, "inPlaceDeadlineSeconds": 60,
         "backoffLimit": 2, "infrastructureBackoffLimit": 4, "hangTimeoutSeconds": 600, "nodeLostGraceSeconds": 30},
        {"worldSize": 2, "image": "trainer:test", "entrypoint": "train.main:run", "gpusPerRank": 0,
         "dataWorkers": {"replicas": 2, "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                         "template": {"metadata": {"labels": {"pool": "cpu"}}, "spec": {"priorityClassName": "low"}}},
         "s3": {"results": "s3://r/x"}, "keepFolders": ["out", "lightning_logs"], "metricsFromOutput": False,
         "topology": {"preferred": "topology.kubernetes.io/zone"}},
        {"worldSize": 4, "ranksPerPod": 2, "image": "trainer:test", "command": ["python", "spawn.py"],
         "launcher": "Command", "trainerRuntime": "Off", "gpusPerRank": 0, "masterPort": 23456, "backend": "gloo",
         "activeDeadlineSeconds": 3600, "startupDeadlineSeconds": 300, "ttlSecondsAfterFinished": 600,
         "restartPolicy": "ExitCode", "suspend": False},
    ]


def spec_paths(crd_file: Path = CRD_FILE) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every field the CRD declares under spec, nested ones too, as a path of keys (0 for a list's first
    item, "*" for a map's key) with its schema."""
    schema = yaml.safe_load(crd_file.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def walk(node: Mapping[str, Any], path: tuple[Any, ...]) -> None:
        if path:
            found.append((path, dict(node)))
        for key, child in (node.get("properties") or {}).items():
            walk(child, (*path, key))
        if isinstance(node.get("items"), Mapping):
            walk(node["items"], (*path, 0))
        if isinstance(node.get("additionalProperties"), Mapping):
            walk(node["additionalProperties"], (*path, "*"))

    walk(schema["properties"]["spec"], ())
    return found


@dataclass(frozen=True)
class Fuzzed:
    """One mutated spec: its index in the run, the base it came from, and what was done to it."""

    index: int
    base: int
    mutations: tuple[str, ...]
    spec: dict[str, Any]

    def describe(self, seed: int) -> str:
        """The spec and how to make it again, for a failure message (huge strings shortened)."""
        shown = json.dumps(shortened(self.spec), ensure_ascii=False)
        return (f"spec #{self.index} of {SEED_ENV}={seed} (base {self.base}; {'; '.join(self.mutations)}):\n"
                f"{shown[:4000]}")


def shortened(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 80:
        return f"{value[:20]}...<{len(value)} chars>"
    if isinstance(value, dict):
        return {shortened(k): shortened(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shortened(v) for v in value]
    return value


def settings() -> tuple[int, int | None]:
    """(seed, count) from DDP_FUZZ_SEED and DDP_FUZZ_COUNT; count None where unset (the test's own)."""
    count = os.environ.get(COUNT_ENV)
    return int(os.environ.get(SEED_ENV) or DEFAULT_SEED), int(count) if count else None


def fuzzed(seed: int, count: int, most_pods: int = 4) -> Iterator[Fuzzed]:
    """`count` mutated specs from `seed`. worldSize and dataWorkers.replicas above `most_pods` (and valid)
    come down to it, gpusPerRank to 1: a run makes a few pods per job, not thousands, and takes few GPUs."""
    rng = random.Random(seed)
    bases, paths = base_specs(), spec_paths()
    for index in range(count):
        base = rng.randrange(len(bases))
        spec = copy.deepcopy(bases[base])
        mutations = tuple(_mutate(rng, spec, paths) for _ in range(rng.choice((1, 1, 2, 3))))
        _cap_pods(spec, most_pods)
        yield Fuzzed(index, base, mutations, spec)


def _mutate(rng: random.Random, spec: dict[str, Any], paths: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> str:
    kind = rng.choice(("set", "set", "set", "delete", "template", "unknown"))
    if kind == "delete":
        present = list(_present(spec, ()))
        path = rng.choice(present)
        parent = _get(spec, path[:-1])
        del parent[path[-1]]
        return f"deleted {_show(path)}"
    if kind == "template":
        field, values = rng.choice(POD_FIELDS)
        where = rng.choice((("template", "spec"), ("dataWorkers", "template", "spec")))
        value = copy.deepcopy(rng.choice(values))
        _put(spec, (*where, field), value)
        return f"set {_show((*where, field))} = {_short(value)}"
    if kind == "unknown":
        objects = [p for p in _present(spec, ()) if isinstance(_get(spec, p), dict)] or [()]
        path = (*rng.choice(objects), rng.choice(("unknownField", "ünïcode", "x-extra")))
        value = _value(rng, {})
        _put(spec, path, value)
        return f"set {_show(path)} = {_short(value)}"
    path, node = rng.choice(paths)
    path = tuple(rng.choice(MAP_KEYS) if key == "*" else key for key in path)
    value = _value(rng, node)
    _put(spec, path, value)
    return f"set {_show(path)} = {_short(value)}"


def _value(rng: random.Random, node: Mapping[str, Any]) -> Any:
    """A value for a field of this schema: mostly of its own kind at an extreme, sometimes of another."""
    kinds = ["number", "string", "wrong", "null"]
    if node.get("type") in ("integer", "number") or "anyOf" in node:
        kinds += ["number"] * 3 + ["bound"] * 2
    if node.get("type") == "string":
        kinds += ["string"] * 3 + ["huge"]
    if node.get("enum"):
        kinds += ["enum"] * 2
    kind = rng.choice(kinds)
    if kind == "bound":
        edges = [node[k] + d for k in ("minimum", "maximum") if k in node for d in (-1, 0, 1)]
        return rng.choice(edges or list(NUMBERS))
    if kind == "enum":
        return rng.choice([*node["enum"], str(node["enum"][0]).lower(), f" {node['enum'][0]}"])
    if kind == "number":
        return rng.choice(NUMBERS)
    if kind == "string":
        return rng.choice(STRINGS)
    if kind == "huge":
        return rng.choice(HUGE)
    if kind == "null":
        return None
    return copy.deepcopy(rng.choice(WRONG_TYPES))


def _cap_pods(spec: dict[str, Any], most: int) -> None:
    gpus = spec.get("gpusPerRank")
    if isinstance(gpus, int) and not isinstance(gpus, bool) and 1 < gpus <= 16:
        spec["gpusPerRank"] = 1  # the fake nodes' GPUs are shared with the other tests on the cluster
    world = spec.get("worldSize")
    if isinstance(world, int) and not isinstance(world, bool) and most < world <= 65536:
        spec["worldSize"] = most
        minimum = spec.get("minWorldSize")
        if isinstance(minimum, int) and not isinstance(minimum, bool) and minimum > most:
            spec["minWorldSize"] = most
    workers = spec.get("dataWorkers")
    replicas = workers.get("replicas") if isinstance(workers, dict) else None
    if isinstance(replicas, int) and not isinstance(replicas, bool) and most < replicas <= 256:
        workers["replicas"] = most


def _present(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """The paths of every value in the spec (not the spec itself)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*path, key)
        yield from _present(child, (*path, key))


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _put(spec: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Sets the value at path, making (or replacing) the objects and lists on the way."""
    parent: Any = spec
    for key, following in zip(path, path[1:], strict=False):
        child = parent[key] if _has(parent, key) else None
        wanted = list if isinstance(following, int) else dict
        if not isinstance(child, wanted):
            child = [{}] if wanted is list else {}
            _set(parent, key, child)
        parent = child
    _set(parent, path[-1], value)


def _has(parent: Any, key: Any) -> bool:
    return key in parent if isinstance(parent, dict) else 0 <= key < len(parent)


def _set(parent: Any, key: Any, value: Any) -> None:
    if isinstance(parent, list):
        while len(parent) <= key:
            parent.append({})
    parent[key] = value


def _show(path: tuple[Any, ...]) -> str:
    return "spec" + "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path)


def _short(value: Any) -> str:
    return json.dumps(shortened(value), ensure_ascii=False)[:120]
