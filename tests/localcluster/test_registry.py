"""Images from a private registry, as shared GPU clusters pull them: a real distribution registry with
TLS and basic auth on this machine (localcluster/registry.sh), `make images REGISTRY=... REGISTRY_CA=...`
pushing both images to it with the credentials of a Docker config, the chart's operator pod pulled
with the chart's imagePullSecrets, a DDPJob's ranks pulled with spec.imagePullSecrets, and the pulls
the registry refuses (a wrong password, a tag that does not exist, a pull secret that does not exist)
said on the job in the kubelet's words. Select with `pytest -m node`.

The node's content store may already hold the images (imported by `make images` under
docker.io/ddp-operator/...): the push uploads those very blobs, zstd layers and manifest alike, so
containerd then fetches nothing but the manifest it resolves the tag to. That is still a pull the
registry authenticates: the manifest GETs in its log, by the user, are what the assertions look for."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ddp_operator import constants as c
from helmchart import CHART, helm_for, ready_operators
from kube import REPO, Cluster, Jobs, cluster_script, own_namespace_in, wait_until
from realnode import create_job, run_to_end, trainer_image
from registry import Registry, stop_registry

pytestmark = [
    pytest.mark.alone("pushes the images with make images and compares the node's whole image store"),
    pytest.mark.node, pytest.mark.images, pytest.mark.timeout(3600),
]

PATH = "ddp"  # the repository path under the registry the images are pushed to
SECRET = "regcred"
WRONG_SECRET = "regcred-wrong"
TAG = re.search(r'^appVersion: "?([^"\n]+)"?$', (CHART / "Chart.yaml").read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]


def image(registry: Registry, name: str, tag: str = TAG) -> str:
    return f"{registry.address}/{PATH}/ddp-operator/{name}:{tag}"


@pytest.fixture(scope="module")
def pushed(private_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """`make images REGISTRY=... REGISTRY_CA=...` as a user types it, with DOCKER_CONFIG naming a folder
    whose config.json holds the credentials (what `docker login` writes); image name -> pushed digest."""
    docker = tmp_path_factory.mktemp("docker")
    (docker / "config.json").write_text(private_registry.auths())
    result = subprocess.run(["make", "images", f"REGISTRY={private_registry.address}/{PATH}",
                             f"REGISTRY_CA={private_registry.ca}"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "DOCKER_CONFIG": str(docker)})
    assert result.returncode == 0, result.stderr[-3000:]
    said = dict(re.findall(rf"pushed {re.escape(private_registry.address)}/{PATH}/ddp-operator/(\w+):{TAG}@(sha256:[0-9a-f]+)",
                           result.stderr))
    assert set(said) == {"operator", "trainer"}, result.stderr[-3000:]
    assert "loaded" not in result.stderr and "into the node" not in result.stderr, result.stderr[-3000:]
    return said


@pytest.fixture(scope="module")
def namespace_of_module(kube_api) -> Iterator[str]:
    """A namespace of this module's own, where its release serves (outside the test session's operator's)."""
    with own_namespace_in(kube_api) as name:
        yield name


@pytest.fixture(scope="module")
def jobs(kube_api, namespace_of_module: str, crd: None) -> Jobs:
    """The module's jobs, served by the release's operator (not the test session's): the CRD is this
    checkout's, which has spec.imagePullSecrets."""
    return Jobs(kube_api, namespace_of_module)


@pytest.fixture(scope="module")
def release(cluster: Cluster, kubectl_module, jobs: Jobs, private_registry: Registry, pushed: dict[str, str]
            ) -> Iterator[client.V1Pod]:
    """The pull secrets (kubectl create secret docker-registry, as a user makes them) and `helm install`
    of charts/ with the operator's image from the registry, pulled with the chart's imagePullSecrets,
    serving this module's namespace only; the operator's pod once Ready. Uninstalled at the end."""
    namespace = jobs.namespace
    for name, password in ((SECRET, private_registry.password), (WRONG_SECRET, "not-the-password")):
        kubectl_module("create", "secret", "docker-registry", name, "-n", namespace,
                       f"--docker-server={private_registry.address}", f"--docker-username={private_registry.user}",
                       f"--docker-password={password}")
    helm = helm_for(cluster)
    repository = image(private_registry, "operator").rsplit(":", 1)[0]
    helm("install", "ddp-operator", str(CHART), "-n", namespace, "--set", f"watchNamespaces={{{namespace}}}",
         "--set", f"image.repository={repository}", "--set-json", f'imagePullSecrets=[{{"name":"{SECRET}"}}]')
    try:
        yield wait_until(lambda: ready_operators(jobs), 180, "the operator's pod to be Ready")[0]  # type: ignore[index]
    finally:
        helm("uninstall", "ddp-operator", "-n", namespace, "--wait", check=False)


@pytest.fixture(scope="module")
def kubectl_module(cluster: Cluster):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([cluster.kubectl, "--kubeconfig", cluster.kubeconfig, *args], capture_output=True,
                              text=True, check=True)

    return run


def manifest_gets(registry: Registry, name: str) -> list[dict[str, str]]:
    """The manifest GETs of image `name` the registry served (200), each with the user it authenticated."""
    return [r for r in registry.served() if r.get("http.request.method") == "GET" and r.get("http.response.status") == "200"
            and r.get("http.request.uri", "").startswith(f"/v2/{PATH}/ddp-operator/{name}/manifests/")]


def node_images(registry: Registry) -> list[str]:
    """The node's containerd's names for images from the registry."""
    return [name for name in node_image_targets() if name.startswith(f"{registry.address}/")]


def node_image_targets() -> dict[str, str]:
    """Every name of the node's containerd (namespace k8s.io) -> the digest it names."""
    lines = cluster_script("ctr", "images", "ls").stdout.splitlines()[1:]
    return {fields[0]: fields[2] for fields in (line.split() for line in lines)}


@pytest.fixture(scope="module", autouse=True)
def names_before_pulls(images_on_the_node: None) -> dict[str, str]:
    """The node's image names before this module's pulls (name -> digest), `make images`' among them."""
    return node_image_targets()


def test_make_images_pushes_both_images_which_only_the_user_may_pull(
        private_registry: Registry, pushed: dict[str, str]) -> None:
    for name, digest in pushed.items():
        path = f"/v2/{PATH}/ddp-operator/{name}/manifests/{TAG}"
        assert private_registry.status(path) == 401  # anonymous: refused, so the node's pulls need the secret
        assert private_registry.status(path, password="not-the-password") == 401
        assert private_registry.status(path, password=private_registry.password) == 200
        assert private_registry.status(f"/v2/{PATH}/ddp-operator/{name}/manifests/{digest}",
                                       password=private_registry.password) == 200
    assert private_registry.status("/v2/") == 401


def test_the_charts_operator_pod_pulls_its_image_with_the_charts_pull_secret(
        private_registry: Registry, pushed: dict[str, str], release: client.V1Pod) -> None:
    assert release.spec.image_pull_secrets[0].name == SECRET
    assert release.spec.containers[0].image == image(private_registry, "operator")
    assert release.status.container_statuses[0].image_id == \
        f"{private_registry.address}/{PATH}/ddp-operator/operator@{pushed['operator']}"
    assert any(r.get("auth.user.name") == private_registry.user for r in manifest_gets(private_registry, "operator"))


def held_up(jobs: Jobs, name: str, timeout: float = 120) -> dict[str, Any]:
    """The job's status once its ranks are held up for an image pull error."""
    jobs.wait_condition(name, c.COND_RANKS_BLOCKED, "True", timeout=timeout)
    return wait_until(lambda: (s := jobs.status(name)).get("reason") == "ImagePullError" and s, 60,
                      f"{name}: reason ImagePullError")  # type: ignore[return-value]


def warned(jobs: Jobs, name: str, needle: str) -> list[str]:
    """The job's Warning Events that contain `needle`."""
    return [e.message for e in jobs.events(name) if e.type == "Warning" and needle in (e.message or "")]


def create_pulling_job(jobs: Jobs, name: str, trainer: str, secret: str, **spec: Any) -> None:
    """Two CPU ranks of the trainer image, pulled with the Secret `secret`. Always pulled: with the
    default IfNotPresent the kubelet (1.34) starts an image already on the node without asking the
    registry whatever the pod's credentials (KubeletEnsureSecretPulledImages, alpha, is off), and
    another test may have pulled it already."""
    template = {"spec": {"containers": [{"name": "trainer", "imagePullPolicy": "Always"}]}}
    create_job(jobs, name, image=trainer, entrypoint="quickstart:main", args=["--epochs", "2"],
               imagePullSecrets=[{"name": secret}], template=template, **spec)


def test_a_wrong_password_is_said_on_the_job_in_the_kubelets_words(
        private_registry: Registry, jobs: Jobs, release: client.V1Pod) -> None:
    create_pulling_job(jobs, "wrongpass", image(private_registry, "trainer"), WRONG_SECRET)
    first = held_up(jobs, "wrongpass")["message"]
    print(f"wrong password, first said: {first}")
    # The kubelet's first pull of a new pod can go without its pull Secret (its Secret cache is not
    # yet allowed to read it: "no basic auth credentials"); its next pull, after the back-off, has it.
    refused = f"{private_registry.address}/v2/{PATH}/ddp-operator/trainer/manifests/{TAG}: 401 Unauthorized"
    message: str = wait_until(lambda: refused in (m := jobs.status("wrongpass").get("message") or "") and m, 90,
                              f"the job to say {refused!r}")  # type: ignore[assignment]
    print(f"wrong password: {message}")
    assert re.search(r"; ranks? [01](-1)? \(ImagePullError\): ", message), message
    assert f"(imagePullSecrets: {WRONG_SECRET};" in message
    assert wait_until(lambda: warned(jobs, "wrongpass", "401 Unauthorized"), 30, "a Warning Event saying 401")
    jobs.delete("wrongpass")


def test_a_tag_that_does_not_exist_is_said_on_the_job_in_the_kubelets_words(
        private_registry: Registry, jobs: Jobs, release: client.V1Pod) -> None:
    missing = image(private_registry, "trainer", "no-such-tag")
    create_pulling_job(jobs, "notag", missing, SECRET)
    message = held_up(jobs, "notag")["message"]
    print(f"missing tag: {message}")
    assert re.search(r"; ranks? [01](-1)? \(ImagePullError\): ", message), message
    assert f"failed to resolve image: {missing}: not found" in message, message
    assert wait_until(lambda: warned(jobs, "notag", f"{missing}: not found"), 30, "a Warning Event saying not found")
    jobs.delete("notag")


def test_a_pull_secret_that_does_not_exist_is_skipped_and_the_job_says_which_it_named(
        private_registry: Registry, jobs: Jobs, release: client.V1Pod) -> None:
    create_pulling_job(jobs, "nosecret", image(private_registry, "trainer"), "no-such-secret")
    message = held_up(jobs, "nosecret")["message"]
    print(f"missing pull secret: {message}")
    # The kubelet pulls without it, the registry refuses the anonymous pull, and the job names the Secret.
    assert "no basic auth credentials (imagePullSecrets: no-such-secret; the kubelet pulls without any that does " \
           "not exist, saying so in the pod's events)" in message, message
    said = [e.message for e in jobs.core.list_namespaced_event(jobs.namespace).items
            if e.involved_object.name in ("nosecret-0", "nosecret-1") and e.reason == "FailedToRetrieveImagePullSecret"]
    assert said and "Unable to retrieve some image pull secrets (no-such-secret)" in said[0], said
    jobs.delete("nosecret")


def test_a_job_pulls_the_trainer_with_its_pull_secret_and_succeeds(
        private_registry: Registry, pushed: dict[str, str], jobs: Jobs, release: client.V1Pod) -> None:
    trainer = image(private_registry, "trainer")
    create_job(jobs, "private", image=trainer, entrypoint="quickstart:main", args=["--epochs", "2"],
               imagePullSecrets=[{"name": SECRET}],
               resources={"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}})
    status = jobs.wait_phase("private", c.PHASE_SUCCEEDED, timeout=600)
    assert status["restarts"] == 0 and status["progress"]["epoch"] == 1, status
    for rank in (0, 1):
        pod = jobs.core.read_namespaced_pod(f"private-{rank}", jobs.namespace)
        assert [s.name for s in pod.spec.image_pull_secrets] == [SECRET]
        assert pod.spec.containers[0].image == trainer
        assert pod.status.container_statuses[0].image_id == \
            f"{private_registry.address}/{PATH}/ddp-operator/trainer@{pushed['trainer']}"
    assert trainer in node_images(private_registry)
    users = {r.get("auth.user.name") for r in manifest_gets(private_registry, "trainer")}
    assert users == {private_registry.user}, users


def test_the_imported_trainer_still_runs_without_credentials_after_its_image_id_was_pulled_with_them(
        pushed: dict[str, str], namespace: str, kube_api) -> None:
    """The pulls above gave the kubelet a record of the trainer's image ID pulled with credentials; the
    name `make images` imported stays usable by any pod (node.sh's pull-verification allowlist), as every
    other test's ranks need it to be, with no pull tried."""
    core = client.CoreV1Api(kube_api)
    pod = run_to_end(core, namespace, "imported", "echo started",
                     container={"image": trainer_image(), "imagePullPolicy": "IfNotPresent"})
    events = [e.reason for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=imported").items]
    assert pod.status.phase == "Succeeded" and "Pulling" not in events, (pod.status, events)


def test_stopping_the_registry_leaves_nothing_behind(private_registry: Registry, pushed: dict[str, str],
                                                    names_before_pulls: dict[str, str]) -> None:
    """Runs last (the fixtures' teardown stops it again: a no-op). The node forgets the pulled images:
    no name the pulls added names a manifest from the registry, not even the image IDs (sha256:<config>)
    the runtime gave them. The names `make images` imported before stay: they name the same manifests."""
    pids = [int((private_registry.folder / f"{name}.pid").read_text()) for name in ("registry", "watchdog")]
    certs = Path(cluster_script("env").stdout.split("CONTAINERD_ADDRESS=")[1].split()[0]).parent / "certs.d"
    assert (certs / private_registry.address / "hosts.toml").is_file()
    print("the node's names for the pulled images:",
          {name: target for name, target in node_image_targets().items() if target in pushed.values()})
    stop_registry(private_registry)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], pids
    assert not (certs / private_registry.address).exists()
    assert not private_registry.folder.exists()
    assert not node_images(private_registry)
    left = {name: target for name, target in node_image_targets().items()
            if target in pushed.values() and names_before_pulls.get(name) != target}
    assert not left, left
    # Its address, not only its port: another test's server may have taken the port on another address since.
    listening = subprocess.run(["ss", "-Htln", "src", private_registry.address],
                               capture_output=True, text=True, check=True).stdout
    assert not listening.strip(), listening
