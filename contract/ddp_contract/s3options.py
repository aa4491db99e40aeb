"""How every boto3 client of ours talks to an S3 store (the runtime's, the data workers', the client's):
checksums, bucket addressing and the CA bundle, from the same settings on each side.

AWS S3 and the stores that call themselves S3-compatible differ where boto3 1.36 changed its defaults:
it now sends a CRC checksum with every upload (an `x-amz-checksum-crc32` header, or an aws-chunked body
with a trailer over https) and a CRC32 instead of Content-MD5 where S3's API requires a checksum
(DeleteObjects). Stores that predate that change (MinIO before 2025, Ceph RGW, Backblaze B2, Google
Cloud Storage's XML API, many appliances) refuse such requests. `when_required` sends checksums only
where the API requires one, as Content-MD5, as every store accepts; `when_supported` is boto3's default.
A custom endpoint gets `when_required` and path-style addressing unless told otherwise; AWS (no
endpoint) gets boto3's defaults.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import envnames

WHEN_REQUIRED = "when_required"
WHEN_SUPPORTED = "when_supported"
CHECKSUMS = (WHEN_REQUIRED, WHEN_SUPPORTED)
ADDRESSING_STYLES = ("path", "virtual", "auto")

# spec.s3's values (the CRD's enums) and the settings they give; Auto (the default) sets none.
AUTO = "Auto"
SPEC_CHECKSUMS = {"WhenRequired": WHEN_REQUIRED, "WhenSupported": WHEN_SUPPORTED}
SPEC_ADDRESSING_STYLES = {"Path": "path", "Virtual": "virtual"}
# Where spec.s3.caBundle's ConfigMap key is mounted in a job's pods.
CA_BUNDLE_DIR = "/etc/ddp-operator/s3-ca"
CA_BUNDLE_FILE = "ca.crt"
DEFAULT_CA_BUNDLE_KEY = "ca.crt"


def spec_settings(spec_s3: Mapping[str, Any]) -> dict[str, str]:
    """The DDP_S3_* settings (name -> value) spec.s3's checksums, addressingStyle and caBundle give a pod."""
    settings = {}
    if spec_s3.get("checksums") in SPEC_CHECKSUMS:
        settings[envnames.S3_CHECKSUMS] = SPEC_CHECKSUMS[spec_s3["checksums"]]
    if spec_s3.get("addressingStyle") in SPEC_ADDRESSING_STYLES:
        settings[envnames.S3_ADDRESSING_STYLE] = SPEC_ADDRESSING_STYLES[spec_s3["addressingStyle"]]
    if spec_s3.get("caBundle"):
        settings[envnames.S3_CA_BUNDLE] = f"{CA_BUNDLE_DIR}/{CA_BUNDLE_FILE}"
    return settings


class S3OptionError(ValueError):
    """A setting that names no known value; the message says which setting and what it may be."""


@dataclass(frozen=True)
class S3Options:
    endpoint: str | None = None
    checksums: str | None = None  # None: when_required with an endpoint, when_supported on AWS
    addressing_style: str | None = None  # None: path with an endpoint, boto3's choice on AWS
    ca_bundle: str | None = None  # a PEM file of the CAs to trust (a private CA's endpoint)

    def __post_init__(self) -> None:
        if self.checksums is not None and self.checksums not in CHECKSUMS:
            raise S3OptionError(f"{envnames.S3_CHECKSUMS}={self.checksums!r} must be one of {', '.join(CHECKSUMS)}")
        if self.addressing_style is not None and self.addressing_style not in ADDRESSING_STYLES:
            raise S3OptionError(f"{envnames.S3_ADDRESSING_STYLE}={self.addressing_style!r} must be one of "
                                f"{', '.join(ADDRESSING_STYLES)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], endpoint: str | None) -> S3Options:
        def setting(name: str) -> str | None:
            return environ.get(name, "").strip().lower() or None

        return cls(endpoint=endpoint, checksums=setting(envnames.S3_CHECKSUMS),
                   addressing_style=setting(envnames.S3_ADDRESSING_STYLE),
                   ca_bundle=environ.get(envnames.S3_CA_BUNDLE, "").strip() or None)

    @property
    def checksum_mode(self) -> str:
        return self.checksums or (WHEN_REQUIRED if self.endpoint else WHEN_SUPPORTED)

    def config_kwargs(self) -> dict[str, Any]:
        """The keyword arguments these options add to botocore's Config."""
        style = self.addressing_style or ("path" if self.endpoint else None)
        return {"request_checksum_calculation": self.checksum_mode,
                "response_checksum_validation": self.checksum_mode,
                **({"s3": {"addressing_style": style}} if style else {})}

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments these options add to `session.client("s3", ...)`."""
        return {"verify": self.ca_bundle} if self.ca_bundle else {}

    def prepare(self, client: Any) -> Any:
        """`client`, made to send Content-MD5 rather than a CRC32 where S3's API requires a checksum,
        when checksums are only sent where required (stores before AWS's 2025 change accept no other)."""
        if self.checksum_mode == WHEN_REQUIRED:
            client.meta.events.register("before-call.s3.DeleteObjects", _content_md5_instead)
        return client


def _content_md5_instead(params: dict[str, Any], **_: Any) -> None:
    """A request whose operation requires a checksum: Content-MD5 of its body, and no flexible checksum."""
    body = params.get("body")
    if not isinstance(body, (bytes, bytearray)):
        return
    checksum = params.get("context", {}).get("checksum", {})
    checksum.pop("request_algorithm", None)
    checksum.pop("request_algorithm_header", None)
    params["headers"]["Content-MD5"] = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
