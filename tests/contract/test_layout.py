"""What lies under a job's results prefix: the names the runtime writes and the client reads."""

import pytest

from ddp_contract import layout


def test_a_kept_folder_is_kept_under_its_path_as_written_without_a_leading_slash() -> None:
    assert layout.kept_folder_key("out") == "out"
    assert layout.kept_folder_key("./out/") == "out"
    assert layout.kept_folder_key("/workspace/runs") == "workspace/runs"
    assert layout.kept_folder_key("a//b/./c") == "a/b/c"
    for bad in ("", " ", ".", "/", "../out", "out/../../x"):
        with pytest.raises(ValueError, match="must name a folder below / without '..' parts"):
            layout.kept_folder_key(bad)
