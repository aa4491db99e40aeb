"""Dashboard benchmark (`make bench-dashboard`): whether `kubectl ddp dashboard` keeps up with many jobs, a
job of many ranks and a long run's curves, in Debian's Chromium driven by Playwright.

Against the local cluster's API server (`--kubeconfig`, default the local cluster's; started where it is
not up) and SeaweedFS on loopback, in a namespace of its own that no operator serves (statuses are
written as the operator writes them; the rank pods stay Pending on a node selector no node has):

  jobs page     `--jobs` DDPJobs: from opening the page to every row shown; then a status patch to
                the row showing it (median of `--changes`), while the other jobs change too
  ranks         a job of `--ranks` pods: the server's answer for its page (median of 5), and from
                opening the page to every rank's row shown
  curve         `--records` records of rank 0 in S3, as the runtime's S3ResultsHandler writes a long
                run's (flushed every FLUSH_EVERY records: parts of about 4 MB; `--one-part`: all in one
                object, as a run that never flushed before its end leaves them): the server's first
                answer for the curves (records read and drawn), the next ones (nothing new: drawn
                before), the mean of all ranks drawn anew, and how many points a curve has
  responsive    while the pages poll, how long the page's main thread takes to answer (p50, p95, max
                of a script run every 100 ms for 10 s): what a user scrolling or clicking waits

Targets: 300 jobs shown < 3 s, a change shown < 2 s, 1,024 ranks shown < 5 s, curves first answered
< 1 s for 200,000 records, responsiveness p95 < 100 ms.

`--curves-only` measures the curves alone: no other jobs, no rank pods, no browser.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / p) for p in ("contract", "client", "images/trainer", "localcluster", "tests")]
from kubernetes import client  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

import ddp_client  # noqa: E402
import demo  # noqa: E402
from ddp_client.store import S3Access  # noqa: E402
from ddp_contract import api, kubeclient, labels  # noqa: E402
from kube import install_crd  # noqa: E402

BUCKET = "bench-dashboard"
RESULTS = f"s3://{BUCKET}/results"
CHROMIUM = "/usr/bin/chromium"
FLUSH_EVERY = 10_000  # records between the S3ResultsHandler's flushes (a long run's flush every 30 s)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TARGETS = {"jobs_shown_s": 3.0, "change_shown_s": 2.0, "ranks_shown_s": 5.0, "curves_first_s": 1.0, "responsive_p95_ms": 100.0}


def job_body(name: str, world: int, s3: str) -> dict[str, Any]:
    return {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": name},
            "spec": {"worldSize": world, "image": "trainer:bench", "entrypoint": "train:main",
                     "s3": {"endpoint": s3, "region": "us-east-1", "credentialsSecret": "s3", "results": RESULTS}}}


def running(step: int, world: int) -> dict[str, Any]:
    return {"status": {"phase": "Running", "ready": f"{world}/{world}", "restarts": 0,
                       "progress": {"epoch": step // 100, "step": step, "loss": 1.0 / (step + 1), "percent": step / 100}}}


def rank_pod(job: str, rank: int) -> dict[str, Any]:
    return {"metadata": {"name": f"{job}-{rank}", "labels": {labels.LABEL_JOB_NAME: job, labels.LABEL_RANK: str(rank),
                                                          labels.LABEL_ATTEMPT: "0"}},
            "spec": {"nodeSelector": {"ddp-bench/none": "none"},
                     "containers": [{"name": labels.CONTAINER_NAME, "image": "trainer:bench"}]}}


def timed(call: Any) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default=str(Path.home() / ".cache/ddp-operator/cluster/kubeconfig"))
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--curves-only", action="store_true", help="only the curves of --records records")
    parser.add_argument("--one-part", action="store_true", help="the records in one object, not in 4 MB parts")
    args = parser.parse_args()
    api_client = kubeclient.api_client(args.kubeconfig, pool_size=32)
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    install_crd(api_client)  # crds/ as it is here (the cluster may have none yet)
    namespace = f"bench-dashboard-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    figures: dict[str, Any] = {"records": args.records, "one_part": args.one_part}
    try:
        with demo.s3_server(0, buckets=(BUCKET,)) as s3:
            core.create_namespaced_secret(namespace, {"metadata": {"name": "s3"}, "stringData": {
                "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})
            names = [] if args.curves_only else [f"job-{i:04d}" for i in range(args.jobs)]
            ranks = 0 if args.curves_only else args.ranks

            def make(name: str) -> None:
                custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, job_body(name, 8, s3))
                custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                             running(10, 8))
            big = "wide"
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(make, names))
                custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                                       job_body(big, args.ranks, s3))
                list(pool.map(lambda r: core.create_namespaced_pod(namespace, rank_pod(big, r)), range(ranks)))
            write_records(s3, namespace, big, args.records, one_part=args.one_part)
            board = ddp_client.dashboard(namespace, api_client=api_client, s3_access=S3Access())
            try:
                if args.curves_only:
                    figures.update(curves_only(board, namespace, big))
                else:
                    with sync_playwright() as playwright:
                        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                        page = browser.new_page(viewport={"width": 1400, "height": 1000})
                        figures.update(jobs_page(page, board.url, custom, namespace, names, args.changes))
                        figures.update(job_page(page, board, namespace, big, ranks))
                        browser.close()
            finally:
                board.stop()
    finally:
        core.delete_namespace(namespace, propagation_policy="Background")
    figures["targets"] = TARGETS
    print(json.dumps(figures, indent=2))
    return 0


def write_records(s3: str, namespace: str, name: str, count: int, one_part: bool = False) -> None:
    import os

    from ddp_trainer.storage import s3 as runtime_s3
    from ddp_trainer.storage.results import S3ResultsHandler

    os.environ.update({"AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY,
                       "DDP_S3_ENDPOINT": s3, "DDP_S3_REGION": "us-east-1"})
    runtime_s3.reset_clients()
    handler = S3ResultsHandler(f"{RESULTS}/{namespace}/{name}", rank=0, flush_interval_s=3600)
    for step in range(count):
        handler.log_metrics(step, epoch=step // 1000, loss=1.0 / (step + 1), accuracy=min(1.0, step / count))
        if step % FLUSH_EVERY == FLUSH_EVERY - 1 and not one_part:
            handler.flush()  # as a job's periodic flushes do: its parts roll over at results.PART_BYTES (4 MB)
    handler.close()


def jobs_page(page: Any, url: str, custom: Any, namespace: str, names: list[str], changes: int) -> dict[str, Any]:
    started = time.monotonic()
    page.goto(url)
    page.wait_for_function(f"document.querySelectorAll('#jobs tbody tr').length >= {len(names) + 1}", timeout=60_000)
    shown = time.monotonic() - started
    delays = []
    for change in range(changes):
        name = names[change * 7 % len(names)]
        step = 1000 + change
        started = time.monotonic()
        custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, namespace, api.PLURAL, name, running(step, 8))
        page.wait_for_function(f"document.querySelector('#jobs tr[data-job=\"{namespace}/{name}\"] .step')"
                               f"?.textContent === '{step}'", timeout=30_000)
        delays.append(time.monotonic() - started)
    return {"jobs": len(names) + 1, "jobs_shown_s": round(shown, 2), "change_shown_s_median": round(statistics.median(delays), 3),
            "change_shown_s_max": round(max(delays), 3), "responsive_jobs_page_ms": responsiveness(page)}


def curve_answers(board: Any, namespace: str, name: str) -> dict[str, Any]:
    """The server's answers for the job's curves: the first (records read from S3, parsed and drawn), the next
    ones (nothing new: drawn before), the mean of all ranks (drawn anew), and the points a curve has."""
    import urllib.request

    def get(**query: str) -> bytes:
        with urllib.request.urlopen(board.link("api/metrics", namespace=namespace, name=name, **query), timeout=120) as answer:
            return bytes(answer.read())
    curves = [timed(lambda: get(rank="0")) for _ in range(3)]
    first_mean = timed(lambda: get(rank="all"))
    drawn = {metric: len(curve["x"]) for metric, curve in json.loads(get(rank="0"))["curves"].items()}
    return {"curves_first_s": round(curves[0], 3), "curves_again_s_median": round(statistics.median(curves[1:]), 3),
            "curves_first_mean_of_ranks_s": round(first_mean, 3), "points_drawn": drawn}


def curves_only(board: Any, namespace: str, name: str) -> dict[str, Any]:
    """curve_answers after one answer for the job's page, as in job_page (the server has the job's handle)."""
    import urllib.request

    urllib.request.urlopen(board.link("api/job", namespace=namespace, name=name), timeout=60).read()
    return curve_answers(board, namespace, name)


def job_page(page: Any, board: Any, namespace: str, name: str, ranks: int) -> dict[str, Any]:
    import urllib.request

    job_url = board.link("api/job", namespace=namespace, name=name)
    answers = [timed(lambda: urllib.request.urlopen(job_url, timeout=60).read()) for _ in range(5)]
    curves = curve_answers(board, namespace, name)
    started = time.monotonic()
    page.goto(board.link("job", namespace=namespace, name=name))
    page.wait_for_function(f"document.querySelectorAll('#ranks tbody tr[data-rank]').length >= {ranks}", timeout=60_000)
    shown = time.monotonic() - started
    page.wait_for_selector('#curves .curve[data-metric="loss"]', timeout=60_000)
    return {"ranks": ranks, "job_answer_s_median": round(statistics.median(answers), 3), "ranks_shown_s": round(shown, 2),
            **curves, "responsive_job_page_ms": responsiveness(page)}


def responsiveness(page: Any, seconds: float = 10.0) -> dict[str, float]:
    """How long the page takes to run a trivial script, every 100 ms for `seconds`, while it polls."""
    waits = []
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        waits.append(timed(lambda: page.evaluate("1")) * 1000)
        time.sleep(0.1)
    waits.sort()
    return {"p50": round(waits[len(waits) // 2], 1), "p95": round(waits[int(len(waits) * 0.95)], 1), "max": round(waits[-1], 1)}


if __name__ == "__main__":
    sys.exit(main())
