"""The job's results prefix in S3, read by the client: settings from the job's spec.s3 and its
credentials Secret (read through the API), or from the environment or flags."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddp_contract import envnames, layout
from ddp_contract.jobspec import S3Spec
from ddp_contract.s3options import S3OptionError, S3Options

DEFAULT_REGION = "us-east-1"
# Local copies of jobs' spec.s3.caBundle certificates, named by their content.
CA_BUNDLES = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddp-operator" / "s3-ca"


class StoreError(RuntimeError):
    """The job's S3 results cannot be reached or read; the message names the object and the cause."""


@dataclass(frozen=True)
class S3Access:
    endpoint: str | None = None
    region: str = DEFAULT_REGION
    access_key_id: str | None = None
    secret_access_key: str | None = None
    checksums: str | None = None  # s3options: when_required or when_supported; None: by the endpoint
    addressing_style: str | None = None
    ca_bundle: str | None = None  # a local PEM file

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> S3Access:
        env = os.environ if environ is None else environ
        try:
            options = S3Options.from_env(env, None)
        except S3OptionError as error:
            raise StoreError(f"environment variable {error}") from None
        return cls(endpoint=env.get(envnames.S3_ENDPOINT) or None,
                   region=env.get(envnames.S3_REGION) or env.get(envnames.AWS_REGION) or DEFAULT_REGION,
                   access_key_id=env.get(envnames.AWS_ACCESS_KEY_ID) or None,
                   secret_access_key=env.get(envnames.AWS_SECRET_ACCESS_KEY) or None,
                   checksums=options.checksums, addressing_style=options.addressing_style,
                   ca_bundle=options.ca_bundle)

    def options(self) -> S3Options:
        return S3Options(endpoint=self.endpoint, checksums=self.checksums, addressing_style=self.addressing_style,
                         ca_bundle=self.ca_bundle)

    def over(self, other: S3Access) -> S3Access:
        """These settings where set, `other`'s elsewhere."""
        return replace(other, **{k: v for k, v in vars(self).items() if v and not (k == "region" and v == DEFAULT_REGION)})


def secret_credentials(secret: Mapping[str, Any], name: str) -> tuple[str, str]:
    """(key id, secret key) from a Secret as the API returns it (base64 `data`)."""
    data = secret.get("data") or {}
    try:
        return tuple(base64.b64decode(data[key]).decode()  # type: ignore[return-value]
                     for key in (envnames.AWS_ACCESS_KEY_ID, envnames.AWS_SECRET_ACCESS_KEY))
    except KeyError as missing:
        raise StoreError(f"Secret {name} has no key {missing}; it needs {envnames.AWS_ACCESS_KEY_ID} and "
                         f"{envnames.AWS_SECRET_ACCESS_KEY}") from None


def job_access(spec_s3: S3Spec, secret: Mapping[str, Any] | None, secret_name: str | None,
               ca_bundle: str | None = None) -> S3Access:
    """What the job's ranks use: spec.s3's endpoint, region, checksums and addressing style, the
    credentials Secret's keys, and `ca_bundle` (a local copy of spec.s3.caBundle's certificates)."""
    key_id, key = secret_credentials(secret, secret_name or "?") if secret is not None else (None, None)
    settings = spec_s3.settings
    return S3Access(endpoint=spec_s3.endpoint, region=spec_s3.region or DEFAULT_REGION,
                    access_key_id=key_id, secret_access_key=key, checksums=settings.get(envnames.S3_CHECKSUMS),
                    addressing_style=settings.get(envnames.S3_ADDRESSING_STYLE), ca_bundle=ca_bundle)


def ca_bundle_file(config_map: Mapping[str, Any], key: str, where: Path) -> str:
    """A ConfigMap's CA bundle (as the API returns it) written under `where`, named by its content."""
    meta = config_map.get("metadata") or {}
    pem = (config_map.get("data") or {}).get(key)
    if not pem:
        raise StoreError(f"ConfigMap {meta.get('namespace')}/{meta.get('name')} (spec.s3.caBundle) has no key {key!r}")
    path = where / f"{hashlib.sha256(pem.encode()).hexdigest()[:16]}.pem"
    if not path.exists():
        where.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(pem)
        partial.replace(path)
    return str(path)


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    if not uri.startswith("s3://") or not uri[5:].partition("/")[0]:
        raise StoreError(f"{uri!r} is not an s3://bucket/prefix URI")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key.strip("/")


_models_lock = threading.Lock()
_models: Any = None  # botocore's loader of AWS's service models, shared by every client made here


def _session() -> Any:
    """A boto3 session of its own (credentials are never shared between jobs) that shares the models' loader:
    a client made from a fresh session reads and parses S3's model again, 0.1-0.2 s of a dashboard's answer."""
    import boto3
    import botocore.session

    global _models
    with _models_lock:
        core = botocore.session.get_session()
        if _models is None:
            _models = core.get_component("data_loader")
        else:
            core.register_component("data_loader", _models)
    return boto3.session.Session(botocore_session=core)


def load_models() -> None:
    """Reads S3's model once ahead (on a thread of its own, say), so that the first client made is quick."""
    _session().client("s3", region_name=DEFAULT_REGION, aws_access_key_id="-", aws_secret_access_key="-")


class ResultsPrefix:
    """One job's results prefix, `<results>/<namespace>/<job>/` (what its ranks keep: results, metrics,
    logs, checkpoints), read by key relative to it."""

    def __init__(self, access: S3Access, results_uri: str, namespace: str, job: str) -> None:
        self.bucket, base = split_uri(results_uri)
        self.prefix = layout.job_key(base, namespace, job)
        self.uri = f"s3://{self.bucket}/{self.prefix}"
        self.access = access  # endpoint and credentials as resolved (flags, environment, the job's own)
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from botocore.config import Config

            a, options = self.access, self.access.options()
            self._client = options.prepare(_session().client(
                "s3", endpoint_url=a.endpoint, region_name=a.region, aws_access_key_id=a.access_key_id,
                aws_secret_access_key=a.secret_access_key, **options.client_kwargs(),
                config=Config(retries={"max_attempts": 5, "mode": "adaptive"}, **options.config_kwargs())))
        return self._client

    def _call(self, what: str, fn: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            raise StoreError(f"{what}: {code or error}") from error
        except BotoCoreError as error:
            raise StoreError(f"{what}: {error}") from error

    def list(self, under: str = "") -> Iterator[tuple[str, int]]:
        """(relative key, size) of every object under `under`, in key order."""
        prefix = f"{self.prefix}/{under.strip('/')}/" if under.strip("/") else f"{self.prefix}/"
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        iterator = iter(pages)
        while True:
            page = self._call(f"listing s3://{self.bucket}/{prefix}", lambda: next(iterator, None))
            if page is None:
                return
            for item in page.get("Contents", []):
                yield item["Key"][len(self.prefix) + 1:], int(item["Size"])

    def get(self, relative: str) -> bytes:
        key = f"{self.prefix}/{relative}"
        response = self._call(f"reading s3://{self.bucket}/{key}",
                              lambda: self.client.get_object(Bucket=self.bucket, Key=key))
        return bytes(response["Body"].read())

    def download(self, relative: str, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = f"{self.prefix}/{relative}"
        self._call(f"downloading s3://{self.bucket}/{key}",
                   lambda: self.client.download_file(self.bucket, key, str(path)))
        return path
