"""Writes that outlive an S3 outage: the retry rules, and the committer against the real S3 server behind a
proxy on loopback that refuses every connection while the outage lasts."""

from __future__ import annotations

import threading

import pytest

from ddp_trainer.errors import StorageUnavailableError
from ddp_trainer.storage import s3
from ddp_trainer.storage.committer import Behind, Committer, Outage, retry_delay
from linkproxy import LinkProxy
from waiting import wait_until


def test_retries_back_off_from_a_second_to_half_a_minute() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 5, 6, 20)] == [1, 2, 4, 16, 30, 30]


def test_an_outage_is_within_its_limit_from_its_first_failure_and_ends_with_a_success() -> None:
    outage = Outage(limit_s=10)
    assert not outage.ongoing
    assert outage.failed(now=1000.0, now_monotonic=5.0) and outage.since == 1000.0
    assert outage.failed(now=1009.0, now_monotonic=14.0)  # 9 s in
    assert not outage.failed(now=1011.0, now_monotonic=16.0)  # 11 s in: past it
    assert outage.failures == 3 and outage.since == 1000.0  # since the first
    outage.ended()
    assert not outage.ongoing and outage.failures == 0
    assert not Outage(limit_s=0).failed(now=1.0, now_monotonic=1.0)  # 0: no outage is within it


class Told:
    """What a committer says waits for S3, in order (None: caught up)."""

    def __init__(self) -> None:
        self.said: list[Behind[tuple[str, bytes]] | None] = []
        self.lock = threading.Lock()

    def __call__(self, behind: Behind[tuple[str, bytes]] | None) -> None:
        with self.lock:
            self.said.append(behind)


def _committer(bucket: str, limit_s: float, told: Told) -> Committer[tuple[str, bytes], str]:
    def write(item: tuple[str, bytes]) -> str:
        s3.put_bytes(s3.S3Url(bucket, item[0]), item[1])
        return item[0]

    return Committer(write, limit_s, "test", behind=told, describe=lambda item: item[0])


def test_while_s3_is_out_the_newest_value_waits_and_is_written_once_it_answers(
        bucket: str, s3_outage: LinkProxy) -> None:
    told = Told()
    commits = _committer(bucket, 60, told)
    commits.hand(("a", b"1"))
    assert commits.wait() == "a"
    assert not commits.out and told.said == []

    s3_outage.down()
    commits.hand(("b", b"2"))
    wait_until(lambda: commits.out, timeout=20, what="the committer to find S3 out")
    assert told.said and told.said[0] is not None and told.said[0].value == ("b", b"2")
    commits.room()  # returns at once while S3 is out: the caller trains on
    commits.hand(("c", b"3"))  # replaces b, which is worth nothing now
    assert not commits.idle()
    wait_until(lambda: s3_outage.refused >= 2, timeout=20, what="a second try through the outage")

    s3_outage.refusing = False
    assert commits.wait() == "c"
    assert s3.get_bytes(s3.S3Url(bucket, "c")) == b"3"
    with pytest.raises(Exception, match="b"):
        s3.get_bytes(s3.S3Url(bucket, "b"))  # never written
    assert told.said[-1] is None and not commits.out  # caught up, and said so
    assert all(b is not None and b.since == told.said[0].since for b in told.said[:-1])  # one outage, since its start


def test_an_outage_longer_than_its_limit_is_raised_to_the_next_caller(bucket: str, s3_outage: LinkProxy) -> None:
    commits = _committer(bucket, 1.5, Told())
    s3_outage.down()
    commits.hand(("late", b"x"))
    with pytest.raises(StorageUnavailableError, match="unreachable for over 1.5 s"):
        commits.wait()
    s3_outage.refusing = False
    commits.hand(("after", b"y"))  # the error was raised once; the committer writes again
    assert commits.wait() == "after"


def test_a_caller_s_own_failed_write_is_tried_again_in_the_background(bucket: str, s3_outage: LinkProxy) -> None:
    told = Told()
    commits = _committer(bucket, 60, told)
    commits.hand(("mine", b"z"), failed=StorageUnavailableError("S3 endpoint unreachable"))
    assert commits.out and told.said[0] is not None and told.said[0].error == "S3 endpoint unreachable"
    assert commits.wait() == "mine"  # S3 answers: written after the first retry delay
    with pytest.raises(StorageUnavailableError, match="DDP_S3_OUTAGE_SECONDS"):  # a limit of 0: fail at once
        _committer(bucket, 0, Told()).hand(("x", b""), failed=StorageUnavailableError("down"))


def test_close_waits_for_the_write_and_ends_the_thread_and_a_later_value_starts_another(bucket: str) -> None:
    before = set(threading.enumerate())
    commits = _committer(bucket, 60, Told())

    def writers() -> list[threading.Thread]:
        return [thread for thread in set(threading.enumerate()) - before if thread.name == "ddp-test"]

    commits.hand(("one", b"1"))
    assert writers()
    assert commits.close() == "one" and writers() == []
    commits.hand(("two", b"2"))
    assert commits.close() == "two" and writers() == []
    assert s3.get_bytes(s3.S3Url(bucket, "two")) == b"2"


def test_room_stops_waiting_for_a_write_still_tried_once_the_probe_finds_s3_out() -> None:
    """The S3 client can retry a write for longer than an outage lasts: room() asks the probe while it
    waits, keeps waiting while S3 answers, and once S3 does not, counts the write in flight as a failed
    try (the outage begins, said with that value) and returns."""
    release, told = threading.Event(), Told()
    answer: list[StorageUnavailableError | None] = [None]
    probed = threading.Semaphore(0)

    def probe() -> StorageUnavailableError | None:
        probed.release()
        return answer[0]

    commits: Committer[tuple[str, bytes], str] = Committer(
        lambda item: release.wait() and item[0], 60, "test", behind=told, describe=lambda item: item[0], probe=probe)
    commits.hand(("a", b"1"))
    returned = threading.Event()
    threading.Thread(target=lambda: (commits.room(), returned.set()), daemon=True).start()
    assert probed.acquire(timeout=20) and probed.acquire(timeout=20)  # S3 answers: still waiting
    assert not returned.is_set() and not commits.out
    answer[0] = StorageUnavailableError("S3 endpoint unreachable")
    assert returned.wait(timeout=20)
    assert commits.out and told.said[0] is not None and told.said[0].value == ("a", b"1")
    commits.hand(("b", b"2"))  # waits behind the write in flight
    release.set()
    assert commits.wait() == "b"
    assert not commits.out and told.said[-1] is None
    commits.close()


def test_the_probe_says_whether_s3_answers(bucket: str, s3_outage: LinkProxy) -> None:
    assert s3.unreachable(bucket) is None
    assert s3.unreachable("no-such-bucket-here") is None  # an answer, though a refusal
    s3_outage.down()
    error = s3.unreachable(bucket)
    assert isinstance(error, StorageUnavailableError) and "unreachable" in str(error)
