"""A private registry for the tests: localcluster/registry.sh's distribution registry with TLS (a CA of
its own) and basic auth, on the real node's bridge gateway, trusted by the node's containerd while it
runs; what a user needs to push to it and pull from it; and what its log says it served."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kube import REPO

REGISTRY_SCRIPT = REPO / "localcluster" / "registry.sh"
USER = "ddp-test"
# A line of the registry's log: key=value fields, values quoted when they hold spaces.
LOG_FIELD = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\S+)')


def registry_script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REGISTRY_SCRIPT), *args], env={**os.environ, **env}, capture_output=True,
                          text=True)


@dataclass(frozen=True)
class Registry:
    folder: Path  # the instance's folder (DDP_REGISTRY_DIR): certificates, htpasswd, storage, log
    address: str  # host:port, on the node's bridge gateway
    user: str
    password: str

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def log(self) -> Path:
        return self.folder / "registry.log"

    def auths(self, password: str | None = None) -> str:
        """A Docker config.json (what `docker login` writes) for this registry, `password` or the user's."""
        token = base64.b64encode(f"{self.user}:{password or self.password}".encode()).decode()
        return json.dumps({"auths": {self.address: {"auth": token}}})

    def status(self, path: str, password: str | None = None, method: str = "GET") -> int:
        """The HTTP status of a request to the registry's API (https://<address><path>), anonymous
        unless `password` (for the user) is given."""
        request = urllib.request.Request(f"https://{self.address}{path}", method=method)
        request.add_header("Accept", "application/vnd.oci.image.manifest.v1+json")
        if password is not None:
            token = base64.b64encode(f"{self.user}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(self.ca)), timeout=30):
                return 200
        except urllib.error.HTTPError as error:
            return error.code

    def served(self) -> list[dict[str, str]]:
        """The requests the registry answered, as its log records them ("response completed": method,
        uri, status and the authenticated user, auth.user.name)."""
        found = []
        for line in self.log.read_text().splitlines():
            fields = {key: value.strip('"') for key, value in LOG_FIELD.findall(line)}
            if fields.get("msg") == "response completed":
                found.append(fields)
        return found


def start_registry(folder: Path) -> Registry:
    """Starts a registry whose folder is `folder`; a watchdog stops it should this process die first."""
    password = secrets.token_hex(12)
    env = {"DDP_REGISTRY_DIR": str(folder), "DDP_REGISTRY_OWNER_PID": str(os.getpid()),
           "DDP_REGISTRY_USER": USER, "DDP_REGISTRY_PASSWORD": password}
    result = registry_script("up", env=env)
    if result.returncode != 0:
        registry_script("down", env=env)
        raise RuntimeError(f"the registry failed to start:\n{result.stderr}")
    return Registry(folder, (folder / "address").read_text().strip(), USER, password)


def stop_registry(registry: Registry) -> None:
    result = registry_script("down", env={"DDP_REGISTRY_DIR": str(registry.folder)})
    assert result.returncode == 0, result.stderr
