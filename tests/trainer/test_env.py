from __future__ import annotations

import signal

import pytest

from ddp_trainer import env
from ddp_trainer.errors import ConfigError, ExitCode

BASE = {"MASTER_ADDR": "master-0", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "4"}


def test_dist_settings_read_from_environment() -> None:
    settings = env.DistSettings.from_env({**BASE, "DDP_BACKEND": "GLOO", "DDP_INIT_TIMEOUT_SECONDS": "30"})
    assert (settings.master_addr, settings.master_port, settings.rank, settings.world_size) == ("master-0", 29500, 1, 4)
    assert settings.backend == "gloo"
    assert settings.init_timeout_s == 30.0
    assert settings.master_wait_s == 30.0  # defaults to the init timeout
    assert (settings.local_rank, settings.local_world_size) == (0, 1)


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"])
def test_missing_variable_is_named(missing: str) -> None:
    values = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ConfigError, match=f"environment variable {missing} is not set"):
        env.DistSettings.from_env(values)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RANK", "x", "RANK='x' is not an integer"),
        ("RANK", "4", "RANK=4 must be < WORLD_SIZE=4"),
        ("MASTER_PORT", "70000", "MASTER_PORT=70000 is not a TCP port"),
        ("DDP_BACKEND", "mpi", "DDP_BACKEND='mpi' must be one of auto, nccl, gloo"),
        ("DDP_INIT_TIMEOUT_SECONDS", "-1", "DDP_INIT_TIMEOUT_SECONDS=-1.0 must be > 0"),
    ],
)
def test_bad_values_are_named(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        env.DistSettings.from_env({**BASE, name: value})


def test_s3_settings() -> None:
    settings = env.S3Settings.from_env(
        {"DDP_S3_ENDPOINT": "http://minio:9000", "AWS_REGION": "eu-west-1",
         "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    )
    assert (settings.endpoint_url, settings.region, settings.access_key_id) == ("http://minio:9000", "eu-west-1", "k")
    assert env.S3Settings.from_env({"DDP_S3_REGION": "a", "AWS_REGION": "b"}).region == "a"
    with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY is not set but its pair is"):
        env.S3Settings.from_env({"AWS_ACCESS_KEY_ID": "k"})
    with pytest.raises(ConfigError, match="DDP_S3_ENDPOINT='minio:9000' must start with http"):
        env.S3Settings.from_env({"DDP_S3_ENDPOINT": "minio:9000"})


def test_s3_options_are_read_and_bad_ones_named(tmp_path) -> None:
    assert env.S3Settings.from_env({"DDP_S3_ENDPOINT": "http://minio:9000"}).options.checksum_mode == "when_required"
    assert env.S3Settings.from_env({}).options.checksum_mode == "when_supported"  # AWS
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    options = env.S3Settings.from_env({"DDP_S3_CHECKSUMS": "When_Supported", "DDP_S3_ADDRESSING_STYLE": "virtual",
                                       "DDP_S3_CA_BUNDLE": str(bundle)}).options
    assert (options.checksums, options.addressing_style, options.ca_bundle) == ("when_supported", "virtual", str(bundle))
    with pytest.raises(ConfigError, match="DDP_S3_CHECKSUMS='crc32' must be one of when_required, when_supported"):
        env.S3Settings.from_env({"DDP_S3_CHECKSUMS": "crc32"})
    with pytest.raises(ConfigError, match="DDP_S3_ADDRESSING_STYLE='dns' must be one of path, virtual, auto"):
        env.S3Settings.from_env({"DDP_S3_ADDRESSING_STYLE": "dns"})
    with pytest.raises(ConfigError, match="DDP_S3_CA_BUNDLE='/nowhere.pem' names no file"):
        env.S3Settings.from_env({"DDP_S3_CA_BUNDLE": "/nowhere.pem"})


def test_exit_codes_are_distinct_and_classified() -> None:
    values = [int(code) for code in ExitCode]
    assert len(values) == len(set(values))
    assert not ExitCode.USER_ERROR.retryable and not ExitCode.CONFIG_ERROR.retryable
    retryable = [c for c in ExitCode if c.retryable]
    assert set(retryable) == {
        ExitCode.MASTER_UNRESOLVED,
        ExitCode.RENDEZVOUS_FAILED,
        ExitCode.COMMUNICATION_ERROR,
        ExitCode.STORAGE_UNAVAILABLE,
        ExitCode.HUNG,
        ExitCode.TERMINATED,
    }
    # Signal exits (128+N) stay distinguishable from ours; TERMINATED is SIGTERM's own on purpose.
    assert all(c > 128 + 64 for c in retryable if c is not ExitCode.TERMINATED)
    assert ExitCode.TERMINATED == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    ("read", "name", "default"),
    [(env.hang_timeout_s, "DDP_HANG_TIMEOUT_SECONDS", None),
     (env.log_upload_interval_s, "DDP_LOG_UPLOAD_INTERVAL_SECONDS", env.DEFAULT_LOG_UPLOAD_INTERVAL_SECONDS)],
)
def test_settings_where_zero_means_off(read, name: str, default: float | None) -> None:
    assert read({}) == default
    assert read({name: "0"}) == 0.0 and read({name: "0.0"}) == 0.0
    assert read({name: "12.5"}) == 12.5
    with pytest.raises(ConfigError, match=f"{name}=-1.0 must be >= 0"):
        read({name: "-1"})
    with pytest.raises(ConfigError, match=f"{name}='soon' is not a number"):
        read({name: "soon"})
