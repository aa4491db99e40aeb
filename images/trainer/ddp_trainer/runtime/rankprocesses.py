"""What runs a pod's rank processes attempt after attempt: the one interface of an entrypoint's
LocalRanks (supervisor.py), a job command's CommandProcess (command.py) and KeptRanks (folderkeeper.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol


class RankProcesses(Protocol):
    """A pod's rank processes for one attempt after another, as runtime/inplace.py runs them: an
    entrypoint's LocalRanks, or a job command's CommandProcess (runtime/command.py)."""

    count: int  # the pod's ranks

    def __enter__(self) -> RankProcesses: ...

    def __exit__(self, *exc: object) -> None: ...

    def prepare_zygote(self, environ: Mapping[str, str]) -> None: ...

    def start(self, environ: Mapping[str, str]) -> None: ...

    def supervise(self, interrupted: Callable[[], bool] = ...) -> bool: ...

    def signal_all(self, signum: int) -> None: ...

    def outcome(self) -> tuple[int, str]: ...

    def pids(self) -> list[int]: ...  # the processes started for the attempt (ranks, or the command)
