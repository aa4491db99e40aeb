"""Metric lines recognised in what a rank prints, and everything else passed over."""

from __future__ import annotations

import json
import math

import pytest

from ddp_contract.metriclines import MAX_LINE, LineScanner, MetricLine, parse

HUGGING_FACE = "{'loss': 0.4123, 'grad_norm': 1.9, 'learning_rate': 4.5e-05, 'epoch': 0.5}"


def test_the_dask_seed_s_json_line_is_recognised_with_its_count_as_the_step() -> None:
    line = parse(json.dumps({"loss": 0.25, "epoch": 1, "count": 40, "worker": 3}))
    assert line == MetricLine(0.25, 40, 1.0, {"loss": 0.25, "epoch": 1.0, "count": 40.0, "worker": 3.0})


def test_hugging_face_s_dict_line_is_recognised_without_a_step() -> None:
    line = parse(HUGGING_FACE)
    assert line is not None and (line.loss, line.step, line.epoch) == (0.4123, None, 0.5)
    assert line.values == {"loss": 0.4123, "grad_norm": 1.9, "learning_rate": 4.5e-05, "epoch": 0.5}


@pytest.mark.parametrize(("printed", "step"), [
    ('INFO:train:{"loss": 1.5, "global_step": 7}', 7),  # a logging format's prefix
    ("{'loss': 2, 'iteration': 3.0, 'tag': 'it\\'s'}", 3),  # a quote inside: read as a literal
    ("{'loss': nan, 'step': 9, 'ok': True}", 9),  # a float's repr of NaN
    ("epoch 3 50%|#####     | 5/10\r{\"loss\": 0.5, \"step\": 5}", 5),  # a progress bar redrawn
])
def test_lines_as_training_code_prints_them(printed: str, step: int) -> None:
    line = parse(printed)
    assert line is not None and line.step == step


def test_a_nan_loss_is_kept_as_a_number() -> None:
    line = parse("{'loss': nan, 'step': 9}")
    assert line is not None and math.isnan(line.loss)


@pytest.mark.parametrize("printed", [
    '{"accuracy": 0.9, "step": 3}',  # no loss
    '{"loss": "0.5", "step": 3}',  # a string where the number belongs
    '{"loss": 0.5, "step": "three"}',  # no number for a step or an epoch
    '{"loss": true, "step": 3}',  # a bool is no number
    '{"loss": 0.5}',  # neither a step nor an epoch
    '{"loss": 0.5, "step": 3',  # truncated
    "[{'loss': 0.5, 'step': 3}]",  # not an object
    "{'loss': __import__('os').getcwd(), 'step': 1}",  # code: never evaluated
    "{'loss': 1e99999 ** 2, 'step': 1}",  # an expression
    "the loss {was} fine",
    "{'loss': 1, 'step': 1, 'x': " + "[" * 1900 + "]" * 1900 + "}",  # nested past the parsers' depth
    '{"loss": 1, "step": 1, "x": ' + "[" * 1900 + "]" * 1900 + "}",
    '{"loss": 0.5, "step": 3, "pad": "' + "x" * MAX_LINE + '"}',  # too long
])
def test_what_is_no_metric_line_is_passed_over(printed: str) -> None:
    assert parse(printed) is None


def test_the_scanner_takes_whole_lines_across_chunks_and_survives_binary_noise() -> None:
    seen: list[MetricLine] = []
    scanner = LineScanner(seen.append)
    stream = (b'\x00\xff\xfe garbage {"loss": \xff}\n' + b'{"loss": 0.5, "st' + b'ep": 1}\n'
              + bytes(range(256)) + b"\n" + b'{"loss": 0.25, "step": 2}' + b"\n" + b'{"loss": 0.1, "step": 3}')
    for i in range(0, len(stream), 7):
        scanner.feed(stream[i:i + 7])
    assert [(line.loss, line.step) for line in seen] == [(0.5, 1), (0.25, 2)]  # the last line is not whole yet
    scanner.feed(b"\n")
    assert seen[-1].step == 3


def test_a_line_longer_than_the_limit_is_dropped_to_its_end() -> None:
    seen: list[MetricLine] = []
    scanner = LineScanner(seen.append)
    scanner.feed(b'{"loss": 1, "step": 1, "x": "' + b"y" * (MAX_LINE + 10))
    scanner.feed(b'", "z": 0}\n{"loss": 0.5, "step": 2}\n')
    assert [line.step for line in seen] == [2]
