"""The container's termination message: the kubelet puts this file's content in the container's
terminated state, and the operator puts that in the job's status.failedRank.message (else it takes the
end of the log)."""

from __future__ import annotations

import logging
import os

from .. import env

log = logging.getLogger("ddp_trainer")

TERMINATION_MESSAGE_BYTES = 4096  # the kubelet keeps at most this much of it


def leave_termination_message(text: str) -> None:
    """Writes the end of `text` where the kubelet reads it. The kubelet creates the file in the
    container: where there is none, this is no container of a pod, and nothing is written."""
    path = env.termination_message_path()
    if not os.path.isfile(path):
        return
    try:
        with open(path, "wb") as f:
            f.write(text.encode()[-TERMINATION_MESSAGE_BYTES:])
    except OSError as error:  # read-only, or not ours: the log still has everything
        log.debug("no termination message at %s: %s", path, error)
