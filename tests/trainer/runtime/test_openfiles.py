"""What /proc says of the files a real child process holds open for writing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ddp_trainer.runtime.openfiles import running, writers_below

HOLDER = """
import mmap, sys
folder, elsewhere = sys.argv[1], sys.argv[2]
open(folder + "/read.txt", "wb").close()
with open(folder + "/mapped.bin", "wb") as out:
    out.write(bytes(4096))
held = [open(folder + "/appended.log", "ab"), open(folder + "/read.txt", "rb"), open(folder + "/sub/truncated.pt", "wb"),
        open(folder + "/both.bin", "w+b"), open(elsewhere + "/outside.log", "wb")]
held[0].write(b"line 1\\n")
held[0].flush()
with open(folder + "/mapped.bin", "r+b") as mapped_file:
    mapping = mmap.mmap(mapped_file.fileno(), 4096)  # shared and writable; the descriptor is closed below
print("holding", flush=True)
sys.stdin.readline()
for handle in held:
    handle.close()
mapping.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def test_the_files_a_child_holds_open_for_writing_or_maps_writable_are_found_with_its_pid(tmp_path: Path) -> None:
    folder, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (folder / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(elsewhere)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "holding\n"
        root = os.path.realpath(folder)
        found = writers_below([root], [child.pid])
        assert found is not None
        mine = {path: pids for path, pids in found.items() if child.pid in pids}
        assert mine == {f"{root}/{name}": frozenset({child.pid})
                        for name in ("appended.log", "sub/truncated.pt", "both.bin", "mapped.bin")}
        assert running(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "closed\n"
        assert writers_below([root], [child.pid]) == {}
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert not running(child.pid)


def test_an_ended_process_is_not_running_before_it_is_reaped_either(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    assert running(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie
    assert not running(child.pid)
    child.wait()


def test_without_proc_nothing_can_be_told(tmp_path: Path) -> None:
    assert writers_below([str(tmp_path)], [os.getpid()], proc=str(tmp_path / "no-proc")) is None
    assert not running(os.getpid(), proc=str(tmp_path / "no-proc"))
