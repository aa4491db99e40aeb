"""Where the CRT uploader sends a PUT: the same request line botocore makes for the same S3Options."""

from __future__ import annotations

import threading

import pytest

from ddp_contract import envnames
from ddp_trainer.env import S3Settings
from ddp_trainer.storage import crtupload


def settings(**environ: str) -> S3Settings:
    return S3Settings.from_env(environ)


def test_a_custom_endpoint_gets_path_style_and_its_scheme() -> None:
    where = crtupload.target(settings(DDP_S3_ENDPOINT="http://10.0.0.5:8333"), "ckpt", "runs/a b/step+1/state.pt")
    assert where == crtupload.Target("10.0.0.5:8333", "/ckpt/runs/a%20b/step%2B1/state.pt", tls=False)


def test_aws_gets_virtual_hosted_requests_over_tls_and_path_style_for_dotted_buckets() -> None:
    aws = settings(DDP_S3_REGION="eu-west-1")
    assert crtupload.target(aws, "ckpt", "k") == crtupload.Target("ckpt.s3.eu-west-1.amazonaws.com", "/k", tls=True)
    assert crtupload.target(aws, "my.bucket", "k") == crtupload.Target("s3.eu-west-1.amazonaws.com", "/my.bucket/k",
                                                                       tls=True)


@pytest.mark.parametrize(("style", "expected"), [
    ("virtual", crtupload.Target("ckpt.store.example:9000", "/base/k~1", tls=True)),
    ("path", crtupload.Target("store.example:9000", "/base/ckpt/k~1", tls=True)),
])
def test_the_addressing_style_setting_and_an_endpoint_s_path_are_kept(style: str, expected: crtupload.Target) -> None:
    given = settings(DDP_S3_ENDPOINT="https://store.example:9000/base/", **{envnames.S3_ADDRESSING_STYLE: style})
    assert crtupload.target(given, "ckpt", "k~1") == expected


def test_ddp_s3_crt_0_turns_it_off() -> None:
    assert settings().crt and not settings(DDP_S3_CRT="0").crt


def test_the_pipe_hands_over_bytes_in_order_holding_at_most_its_limit() -> None:
    pipe = crtupload.Pipe(limit=10)
    held: list[int] = []

    def writer() -> None:
        for i in range(50):
            pipe.write(bytes([i]) * 7)
            held.append(pipe._held)
        pipe.finish()

    thread = threading.Thread(target=writer)
    thread.start()
    read = bytearray()
    buffer = bytearray(4)
    while count := pipe.readinto(buffer):
        read += buffer[:count]
    thread.join()
    assert bytes(read) == b"".join(bytes([i]) * 7 for i in range(50))
    assert max(held) < 10 + 7  # a write waits until the reader took the held bytes below the limit


def test_stopping_the_pipe_wakes_a_waiting_writer_with_the_error() -> None:
    pipe = crtupload.Pipe(limit=4)
    pipe.write(b"full")
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            pipe.write(b"more")
        except crtupload.UploadEnded as error:
            failed.append(error)

    thread = threading.Thread(target=writer)
    thread.start()
    pipe.stop(crtupload.UploadEnded("the upload failed"))
    thread.join(10)
    assert not thread.is_alive() and str(failed[0]) == "the upload failed"
    assert pipe.readinto(bytearray(8)) == 0  # a stopped pipe reads as ended
