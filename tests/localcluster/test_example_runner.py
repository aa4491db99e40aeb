"""`make example`'s pieces without a cluster: each example's job file is what a user applies to a real
cluster (no node steering), only its S3 endpoint replaced; the loss summary it prints."""

from __future__ import annotations

import pytest
import yaml

import demo
import example

ENDPOINT = "http://10.244.200.1:41157"


@pytest.mark.parametrize("name", example.NAMES)
def test_each_examples_job_file_is_applied_as_written_but_for_its_endpoint(name: str) -> None:
    written = example.job_file(name).read_text()
    job = yaml.safe_load(written)
    assert "template" not in job["spec"], "no node steering: its ranks go wherever the cluster puts them"
    assert job["metadata"]["name"] == name and job["spec"]["image"].startswith("ddp-operator/trainer:")
    replaced = demo.with_endpoint(written, ENDPOINT)
    changed = [(a, b) for a, b in zip(written.splitlines(), replaced.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and "endpoint:" in changed[0][0], changed
    assert example.load_job(name, ENDPOINT) == yaml.safe_load(replaced)
    assert example.buckets(job) == ("ddp-examples",)


def test_an_unknown_example_names_the_ones_there_are() -> None:
    with pytest.raises(SystemExit, match="unknown example 'mnist'; the examples are: petnames, transfer, shards, fashion"):
        example.job_file("mnist")


def test_loss_ends_average_every_rank_over_the_first_and_last_tenth_of_the_steps() -> None:
    records = [{"step": s, "rank": r, "loss": 10.0 - s / 10 + r} for s in range(1, 101) for r in (0, 1)]
    start, end = example.loss_ends(records)
    assert start == pytest.approx(10.0 - 5.5 / 10 + 0.5) and end == pytest.approx(10.0 - 95.5 / 10 + 0.5)
    with pytest.raises(ValueError, match="no metric records with a loss"):
        example.loss_ends([{"step": 1, "loss": None}])
