"""What the dashboard's pages show, from jobs, pods, Events and metric records as the API server and S3 hold them."""

from __future__ import annotations

from typing import Any

from ddp_client.web import views
from podfixtures import pod


def job(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "team", "name": "mnist", "creationTimestamp": "2026-11-27T10:00:00Z"},
            "spec": {"worldSize": 2, **spec}, "status": status or {}}


def event(reason: str, message: str, time: str, kind: str = "DDPJob", name: str = "mnist") -> dict[str, Any]:
    return {"reason": reason, "message": message, "type": "Warning", "lastTimestamp": time,
            "involvedObject": {"kind": kind, "name": name}}


def test_a_job_s_row_says_its_phase_ranks_restarts_and_how_far_it_is() -> None:
    row = views.job_row(job({"phase": "Running", "ready": "2/2", "restarts": 1,
                             "progress": {"epoch": 2, "step": 40, "loss": 0.25, "percent": 40.0, "remaining": "3m"}}))
    assert (row["phase"], row["ready"], row["restarts"], row["step"], row["percent"], row["remaining"]) == (
        "Running", "2/2", 1, 40, 40.0, "3m")
    assert views.job_row(job())["phase"] == "Pending" and views.job_row(job())["ready"] == "0/2"


def test_ranks_say_where_they_run_why_they_are_held_and_the_failed_one_its_last_words() -> None:
    failed = {"rank": 1, "pod": "mnist-1", "reason": "Error", "exitCode": 3, "kind": "Program", "attempt": 0,
              "message": "Traceback ...\nValueError: bad batch"}
    pods = [pod(1, "failed", exit_code=3, node="gpu-2"), pod(0, "pending", unschedulable="0/3 nodes are available")]
    rows = views.rank_rows(pods, {"failedRank": failed})
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[0]["held"] == "Unschedulable: 0/3 nodes are available" and rows[0]["failure"] is None
    assert rows[1]["node"] == "gpu-2" and rows[1]["ended"]["exitCode"] == 3
    assert rows[1]["failure"]["lastWords"].endswith("ValueError: bad batch")


def test_where_the_status_names_the_gang_a_pod_s_rank_is_its_place_there_and_a_spare_waits_after() -> None:
    pods = [pod(0), pod(1), pod(2)]
    rows = views.rank_rows(pods, {"members": [0, 2]})  # pod 2, a spare, took pod 1's place
    assert [(r["pod"], r["rank"]) for r in rows] == [("mnist-0", 0), ("mnist-2", 1), ("mnist-1", None)]
    assert [r["rank"] for r in views.rank_rows(pods, {})] == [0, 1, 2]


def test_a_pod_that_replaced_a_failed_one_under_its_name_shows_no_failure() -> None:
    """Rank 1's pod of attempt 0 vanished and the gang restarted: the new mnist-1 (attempt 1) ended well."""
    failed = {"rank": 1, "pod": "mnist-1", "reason": "RankMissing", "kind": "Infrastructure", "attempt": 0}
    pods = [pod(0, "succeeded", attempt=1), pod(1, "succeeded", attempt=1)]
    for phase in ("Running", "Succeeded"):
        rows = views.rank_rows(pods, {"phase": phase, "attempt": 1, "failedRank": failed})
        assert [r["failure"] for r in rows] == [None, None], phase
    old = views.rank_rows([pod(1, "failed", exit_code=1, attempt=0)], {"phase": "Restarting", "attempt": 1,
                                                                        "failedRank": failed})
    assert old[0]["failure"]["reason"] == "RankMissing"  # the failed attempt's own pod, still there


def test_a_failed_job_s_failure_stays_on_the_pod_kept_across_in_place_attempts() -> None:
    failed = {"rank": 0, "pod": "mnist-0", "reason": "Error", "exitCode": 1, "kind": "Program", "attempt": 3}
    kept = pod(0, "failed", exit_code=1, attempt=0)
    assert views.rank_rows([kept], {"phase": "Failed", "attempt": 3, "failedRank": failed})[0]["failure"] is not None
    assert views.rank_rows([kept], {"phase": "Running", "attempt": 4, "failedRank": failed})[0]["failure"] is None


def test_a_finished_job_s_last_restart_is_history_not_its_failure() -> None:
    failed = {"rank": 0, "pod": "mnist-0", "reason": "RankMissing", "kind": "Infrastructure", "attempt": 1}
    succeeded = views.job_page(job({"phase": "Succeeded", "reason": "AllRanksSucceeded", "failedRank": failed}), [], [])
    assert succeeded["failure"] == "" and succeeded["lastRestart"].startswith("caused by: rank 0 (pod mnist-0)")
    failed_page = views.job_page(job({"phase": "Failed", "reason": "BackoffLimitExceeded", "failedRank": failed}), [], [])
    assert "failed rank: rank 0" in failed_page["failure"] and failed_page["lastRestart"] == ""


def test_a_job_s_page_says_when_its_checkpoint_waits_for_s3() -> None:
    behind = {"since": "2027-01-15T08:01:10Z", "step": 400, "error": "S3 endpoint unreachable"}
    page = views.job_page(job({"phase": "Running", "checkpointsBehind": behind}), [], [])
    assert page["status"]["checkpointsBehind"].startswith("step 400 waits for S3, unreachable since 2027-01-15T08:01:10Z")
    assert views.job_page(job({"phase": "Running"}), [], [])["status"]["checkpointsBehind"] == ""


def records(attempt: int, steps: range, start: float) -> list[dict[str, Any]]:
    return [{"step": s, "loss": 1.0 / (s + 1), "rank": 0, "attempt": attempt, "time": start + i} for i, s in enumerate(steps)]


def test_each_attempt_after_the_first_is_marked_at_its_first_step_with_the_job_s_events_between() -> None:
    logged = records(0, range(0, 50), 1_800_000_000.0) + records(1, range(40, 90), 1_800_000_100.0)
    events = views.event_rows([
        event("RankFailed", "rank 1 exited 1", "2027-01-15T08:01:10Z"),  # 1800000070: between the attempts
        event("Started", "container started", "2027-01-15T08:01:11Z", kind="Pod", name="mnist-1"),  # a pod's
        event("PodsCreated", "2 pods", "2027-01-15T07:59:00Z"),  # before: not this restart's
    ])
    marks = views.attempt_marks(logged, events)
    assert marks == [{"attempt": 1, "time": 1_800_000_100.0, "step": 40, "why": "RankFailed: rank 1 exited 1",
                      "resumed": ""}]
    assert views.attempt_marks(records(0, range(5), 0.0), events) == []
    # Where the attempt resumed from, as its rank 0 kept it (status.recovery).
    resumed = {1: {"attempt": 1, "step": 40, "source": "Memory", "pods": ["mnist-0"], "stepsLost": 1}}
    (mark,) = views.attempt_marks(logged, events, resumed=resumed)
    assert mark["resumed"] == "attempt 1 resumed at step 40 from the memory of pod mnist-0, 1 step lost"


def test_curves_are_drawn_with_at_most_the_points_asked_for_and_against_time_on_request() -> None:
    logged = records(0, range(10_000), 1_800_000_000.0)
    drawn = views.curves(logged, 0, points=500)["loss"]
    assert len(drawn["x"]) == 500 and drawn["points"] == 10_000 and (drawn["x"][0], drawn["x"][-1]) == (0, 9999)
    timed = views.curves(logged[:10], 0, axis="time")["loss"]
    assert timed["x"] == [1_800_000_000.0 + i for i in range(10)] and timed["y"][0] == 1.0
    assert views.curves(logged, 3) == {}  # rank 3 logged nothing


def test_a_log_is_paged_from_its_end_at_line_starts() -> None:
    text = "".join(f"line {i:04d}\n" for i in range(1000))  # 10 bytes a line
    last = views.log_page(text, size=95)
    assert last["text"] == "".join(f"line {i:04d}\n" for i in range(991, 1000)) and last["end"] == 10_000
    older = views.log_page(text, end=last["start"], size=95)
    assert older["text"].startswith("line 0982\n") and older["end"] == last["start"]
    assert views.log_page("", size=10) == {"text": "", "start": 0, "end": 0, "total": 0}


def test_each_rank_s_newest_step_shows_which_rank_lags() -> None:
    logged = records(0, range(0, 100), 1_800_000_000.0) + [
        {"step": s, "loss": 0.5, "rank": 1, "attempt": 0, "time": 1_800_000_000.0 + s} for s in range(0, 40)]
    logged.append({"step": 7, "loss": 0.5, "rank": 2})  # no time: not counted
    assert views.last_steps(logged) == {0: {"step": 99, "time": 1_800_000_099.0}, 1: {"step": 39, "time": 1_800_000_039.0}}


def test_every_rank_s_curve_side_by_side_shares_the_steps_with_gaps_where_a_rank_logged_none() -> None:
    logged = records(0, range(0, 10), 0.0) + [{"step": s, "loss": 2.0, "rank": 1, "time": float(s)} for s in range(5, 15)]
    drawn = views.curves_by_rank(logged)["loss"]
    assert drawn["x"] == list(range(15)) and drawn["points"] == 10
    assert drawn["ys"]["0"][:10] == [1.0 / (s + 1) for s in range(10)] and drawn["ys"]["0"][10:] == [None] * 5
    assert drawn["ys"]["1"] == [None] * 5 + [2.0] * 10
    many = [{"step": s, "loss": 1.0, "rank": r, "time": float(s)} for r in range(20) for s in range(3000)]
    bounded = views.curves_by_rank(many, most_ranks=4, points=500)["loss"]
    assert sorted(bounded["ys"], key=int) == ["0", "1", "2", "3"] and len(bounded["x"]) == 500 and bounded["x"][-1] == 2999


def test_a_restart_whose_events_are_gone_is_marked_with_the_cause_its_rank_0_kept() -> None:
    logged = records(0, range(0, 50), 1_800_000_000.0) + records(1, range(40, 90), 1_800_000_100.0) + \
        records(2, range(80, 120), 1_800_000_200.0)
    kept = {1: {"attempt": 1, "reason": "RankMissing", "message": "rank 1 (pod mnist-1) was lost"},
            2: {"attempt": 2, "reason": "Resized", "message": "the gang shrinks to 1 rank"}}
    events = views.event_rows([event("RankFailed", "rank 0 exited 1", "2027-01-15T08:03:10Z")])  # 1800000190
    marks = views.attempt_marks(logged, events, kept)
    assert [m["why"] for m in marks] == ["RankMissing: rank 1 (pod mnist-1) was lost", "RankFailed: rank 0 exited 1"]
    assert [m["why"] for m in views.attempt_marks(logged, [], {})] == ["", ""]
