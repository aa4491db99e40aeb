"""The PNG plot of metrics against the step."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from ddp_client.plot import POINTS_PER_PANEL, plot_series


def test_one_panel_per_metric_loss_first_in_a_png_of_the_expected_size(tmp_path: Path) -> None:
    series = {"accuracy": [(1, 0.2), (2, 0.5)], "loss": [(1, 2.0), (2, 1.0), (3, 0.5)]}
    drawn = plot_series(series, tmp_path / "plots" / "m.png", title="ns/job", width_in=6, panel_in=2, dpi=50)
    assert list(drawn.items()) == [("loss", series["loss"]), ("accuracy", series["accuracy"])]  # top to bottom
    with Image.open(tmp_path / "plots" / "m.png") as image:
        assert image.format == "PNG" and image.size == (300, 200)  # 6 in x (2 panels x 2 in) at 50 dpi
        image.load()
        colours = image.convert("RGB").getcolors(maxcolors=100000)
    assert colours is not None and len(colours) > 10  # lines, text and axes drawn, not a blank canvas


def test_nothing_to_plot_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no metrics to plot"):
        plot_series({}, tmp_path / "m.png")


def test_a_long_run_is_drawn_with_at_most_the_panel_s_points_its_ends_and_spikes_kept(tmp_path: Path) -> None:
    loss = [(step, 1.0 / step) for step in range(1, 50_001)]
    loss[31_415] = (31_416, 9.0)  # one step's loss spiked
    drawn = plot_series({"loss": loss}, tmp_path / "m.png")["loss"]
    assert len(drawn) == POINTS_PER_PANEL
    assert drawn[0] == loss[0] and drawn[-1] == loss[-1] and (31_416, 9.0) in drawn
