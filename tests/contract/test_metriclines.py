"""Metric lines recognised in what a rank prints, and everything else passed over."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ddp_contract.metriclines import MAX_LINE, LineScanner, MetricLine, ProgressBar, parse, parse_bar

HUGGING_FACE = "{'loss': 0.4123, 'grad_norm': 1.9, 'learning_rate': 4.5e-05, 'epoch': 0.5}"


def test_dask_pytorch_ddp_s_json_line_is_recognised_with_its_count_as_the_step() -> None:
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
    '{"loss": "low", "step": 3}',  # a string where the number belongs that holds none
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
    scanner.feed(b'{"loss": 1, "step": 3, "x": "' + b"y" * (MAX_LINE + 10))
    scanner.feed(b'yyy"}\n')  # its end: no brace to read in it, the line after is read again
    scanner.feed(b'{"loss": 0.5, "step": 4}\n')
    assert [line.step for line in seen] == [2, 4]


PRINTED = Path(__file__).parent / "printed"  # real runs' output: printed/README.md says which


def scanned(name: str, chunk: int = 97) -> tuple[list[MetricLine], list[ProgressBar]]:
    """Metric lines and bars in a captured output, fed in chunks as a pipe delivers it."""
    lines: list[MetricLine] = []
    bars: list[ProgressBar] = []
    scanner = LineScanner(lines.append, bars.append)
    data = (PRINTED / name).read_bytes()
    for start in range(0, len(data), chunk):
        scanner.feed(data[start:start + chunk])
    return lines, bars


@pytest.mark.parametrize("version", ["4.57", "5.23"])
def test_hugging_face_trainer_log_dicts_are_read_with_numbers_or_numbers_as_strings(version: str) -> None:
    lines, _ = scanned(f"transformers-{version}-trainer.stdout")
    # 8 training log dicts (logging_steps=2 of 16 steps); the eval and summary dicts have no `loss`.
    assert len(lines) == 8 and all(line.step is None for line in lines)
    assert [line.epoch for line in lines] == pytest.approx([0.125 * i for i in range(1, 9)], abs=0.006)
    assert all(3.8 < line.loss < 4.0 and 0 < line.values["learning_rate"] < 1e-4 for line in lines)
    assert "grad_norm" in lines[0].values


def test_a_string_that_holds_a_number_is_the_number_and_no_other_string_is() -> None:
    line = parse("{'loss': '1.5e-03', 'epoch': '2', 'grad_norm': 'nan', 'tag': 'abc', 'note': '1.2.3'}")
    assert line is not None and (line.loss, line.epoch) == (0.0015, 2.0)
    assert set(line.values) == {"loss", "epoch", "grad_norm"} and math.isnan(line.values["grad_norm"])


@pytest.mark.parametrize("version", ["4.57", "5.23"])
def test_hugging_face_trainer_bars_count_the_run_s_steps_and_its_evaluations_apart(version: str) -> None:
    _, bars = scanned(f"transformers-{version}-trainer.stderr")
    run = [bar for bar in bars if bar.total == 16]
    evaluations = [bar for bar in bars if bar.total == 4]
    assert run and evaluations and len(run) + len(evaluations) == len(bars)
    assert [bar.n for bar in run] == sorted(bar.n for bar in run) and run[-1].n == 16 and run[-1].fraction == 1.0
    assert all(bar.elapsed_s is not None and bar.desc == "" for bar in run)


def test_lightning_s_tqdm_bar_says_the_epoch_the_batch_and_the_losses_of_its_postfix() -> None:
    _, bars = scanned("lightning-2.6-tqdm-bar.stdout")
    epochs = [bar for bar in bars if bar.desc.startswith("Epoch")]
    assert {bar.desc for bar in epochs} == {"Epoch 0", "Epoch 1"} and {bar.total for bar in epochs} == {16}
    assert epochs[-1].n == 16 and epochs[-1].values == {"train_loss": 0.551, "val_loss": 0.602}
    others = {bar.desc for bar in bars} - {bar.desc for bar in epochs}
    assert others == {"Sanity Checking", "Sanity Checking DataLoader 0", "Training", "Validation", "Validation DataLoader 0"}
    assert all(bar.total is None for bar in bars if bar.desc in ("Sanity Checking", "Training", "Validation"))


def test_lightning_s_rich_bar_is_read_as_it_draws_its_last_state_on_a_pipe() -> None:
    _, bars = scanned("lightning-2.6-rich-bar.stdout")
    assert bars == [ProgressBar("Epoch 1/1", 16.0, 16.0, 0.0, 0.0, {"train_loss": 0.551}, rich=True)]


def test_a_plain_loop_s_bars_with_their_postfix_and_nested_bars_under_escapes() -> None:
    _, bars = scanned("tqdm-4.70-loop.stderr")
    assert {bar.desc for bar in bars} == {"epoch 0", "epoch 1"} and bars[-1].n == bars[-1].total == 20
    assert "loss" in bars[-1].values
    _, nested = scanned("tqdm-4.70-nested.stderr")
    assert {bar.desc for bar in nested} == {"Epoch 1/2", "Epoch 2/2", "epochs", "batches"}
    assert max(bar.n for bar in nested if bar.desc == "epochs") == 3
    assert {bar.total for bar in nested if bar.desc == "batches"} == {8.0}


@pytest.mark.parametrize(("drawn", "bar"), [
    ("train:  45%|####5     | 45/100 [00:12<00:15,  3.61it/s, loss=0.123, lr=1e-3]",
     ProgressBar("train", 45, 100, 12, 15, {"loss": 0.123, "lr": 0.001})),
    ("100%|##########| 1.20k/1.20k [1:02:03<00:00,  2.00s/it]", ProgressBar("", 1200, 1200, 3723, 0, {})),
    ("read: 45it [00:12,  3.61it/s]", ProgressBar("read", 45, None, 12, None, {})),
    ("Training: |          | 0/? [00:00<?, ?it/s]", ProgressBar("Training", 0, None, 0, None, {})),
    ("\x1b[A\x1b[2Kbatches:  50%|#####     | 4/8 [00:00<00:00, 33.18it/s]\x1b[A",
     ProgressBar("batches", 4, 8, 0, 0, {})),
])
def test_a_bar_s_drawing_in_tqdm_s_forms(drawn: str, bar: ProgressBar) -> None:
    assert parse_bar(drawn) == bar


@pytest.mark.parametrize("drawn", [
    "2026-11-24 10:00:00 INFO trainer: batch 1234 read from shard-000017.tar in 0.8 ms, queue depth 4",
    "45/100 samples done",
    "|    | 1/2",
    "x" * (MAX_LINE + 1) + " 45%|# | 1/2 [00:00<00:00, 1it/s]",
])
def test_what_is_no_bar_is_passed_over(drawn: str) -> None:
    assert parse_bar(drawn) is None


def test_a_bar_is_read_as_soon_as_it_is_drawn_and_not_again_when_the_next_drawing_ends_it() -> None:
    bars: list[ProgressBar] = []
    scanner = LineScanner(lambda line: None, bars.append)
    scanner.feed(b"\r 10%|#         | 1/10 [00:01<00:09,  1.00it/s]")
    assert [bar.n for bar in bars] == [1]
    scanner.feed(b"\r 20%|##        | 2/10 [00:02<00:08,  1.00it/s]")
    scanner.feed(b"\n")
    assert [bar.n for bar in bars] == [1, 2]
