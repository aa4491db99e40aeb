"""`ddp_client.dashboard()` (`kubectl ddp dashboard`) in a real headless browser: Debian's Chromium, driven by
Playwright, against the local cluster's API server and the S3 server on loopback.

One job trains for real (the operator, the pod runner's rank processes): its curve grows on the page while
it runs. The others live in a namespace no operator serves, so each test writes their status as the
operator would (the status subresource) and their metrics with the runtime's own S3ResultsHandler: what the
pages show is then known exactly. Screenshots of the pages go to $DDP_TEST_SCREENSHOTS where set."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client
from playwright.sync_api import Browser, Page, expect, sync_playwright

import ddp_client
import demo
from ddp_client.store import S3Access
from ddp_client.web import RunningDashboard
from ddp_contract import api, layout
from e2ehelp import BUCKET as E2E_BUCKET
from kube import REPO, Jobs, client_as, own_namespace_in
from ports import free_port

BUCKET = "ddp-dashboard"
RESULTS = f"s3://{BUCKET}/results"
SECRET = "s3-credentials"
CHROMIUM = os.environ.get("DDP_TEST_CHROMIUM", "/usr/bin/chromium")
# As the machine notes say Chromium must run here: no sandbox as root, nothing reached for off the machine.
# A name that resolves to this machine, as a page's own name does once its DNS is rebound to 127.0.0.1.
REBOUND = "rebound.example"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]
WAIT_MS = 30_000
# A job's pods are Running before its ranks have imported torch, formed the gang and flushed a first step:
# on a busy 2-core machine that alone can take most of a minute.
JOB_MS = 120_000
IMAGE = "ddp-operator/trainer:0.1.0"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with demo.s3_server(0, buckets=(BUCKET,)) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def space(cluster: Any, kube_api: Any, crd: None, s3: str) -> Iterator[str]:
    """A namespace of the module's own, outside every test operator's, with the jobs' S3 credentials."""
    with own_namespace_in(kube_api) as name:
        client.CoreV1Api(kube_api).create_namespaced_secret(name, {"metadata": {"name": SECRET}, "stringData": {
            "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})
        yield name


@pytest.fixture(scope="module")
def board(kube_api: Any, space: str) -> Iterator[RunningDashboard]:
    """The dashboard of `space`, reading S3 as each job says (its endpoint, its Secret): nothing given here."""
    running = ddp_client.dashboard(space, api_client=kube_api, s3_access=S3Access())
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `make test` installs Debian's (scripts/chromium.sh)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    opened = browser.new_page(viewport={"width": 1400, "height": 1000})
    yield opened
    keep_screenshot(opened, request)
    opened.close()


def keep_screenshot(page: Page, request: pytest.FixtureRequest) -> None:
    """The page as the test left it, to $DDP_TEST_SCREENSHOTS/<test>.png where that is set."""
    where = os.environ.get("DDP_TEST_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{request.node.name}.png"), full_page=True)


def create_job(kube_api: Any, namespace: str, name: str, s3: str, status: dict[str, Any]) -> None:
    """A DDPJob keeping its results in the test's S3 server, with `status` as an operator would write it."""
    custom = client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, {
        "apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": name},
        "spec": {"worldSize": 2, "image": "trainer:test", "entrypoint": "train:main", "s3": {
            "endpoint": s3, "region": "us-east-1", "credentialsSecret": SECRET, "results": RESULTS}}})
    set_status(kube_api, namespace, name, status)


def set_status(kube_api: Any, namespace: str, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": status})


def log_metrics(monkeypatch: pytest.MonkeyPatch, s3: str, namespace: str, name: str, steps: range,
                attempt: int = 0) -> None:
    """Rank 0's records of `steps`, written by the runtime's own handler as a rank writes them."""
    from ddp_trainer.storage import s3 as runtime_s3
    from ddp_trainer.storage.results import S3ResultsHandler

    for variable, value in {"AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY,
                            "DDP_S3_ENDPOINT": s3, "DDP_S3_REGION": "us-east-1"}.items():
        monkeypatch.setenv(variable, value)
    runtime_s3.reset_clients()
    handler = S3ResultsHandler(f"{RESULTS}/{namespace}/{name}", rank=0, flush_interval_s=3600, attempt=attempt)
    for step in steps:
        handler.log_metrics(step, epoch=step // 10, loss=1.0 / (step + 1), accuracy=step / 100)
    handler.close()
    runtime_s3.reset_clients()


def test_a_training_job_s_curve_gains_points_while_it_runs(
        jobs: Jobs, kube_api: Any, s3_endpoint: str, podrunner: Path, browser: Browser,
        request: pytest.FixtureRequest) -> None:
    """A real DDP job of 2 ranks (the pod runner's processes) logs its loss every step and flushes every
    second: the page, opened once, shows the curve growing while the job is Running, then Succeeded, each
    rank's newest step, and both ranks' curves side by side."""
    jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": SECRET}, "stringData": {
        "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})
    template = demo.on_local_runner({"spec": {}})["spec"]["template"]
    job = ddp_client.submit(str(Path(__file__).parent / "dashboard_train.py"), image=IMAGE, world_size=2,
                            gpus=0, args=["60", "0.25"], namespace=jobs.namespace, api_client=kube_api,
                            s3=ddp_client.S3(endpoint=s3_endpoint, region="us-east-1", credentials_secret=SECRET,
                                             results=f"s3://{E2E_BUCKET}/results"),
                            spec={"template": template, "masterPort": free_port(), "backoffLimit": 0})
    running = ddp_client.dashboard(jobs.namespace, api_client=kube_api, s3_access=S3Access())
    opened = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        opened.goto(running.link("job", namespace=jobs.namespace, name=job.name))
        expect(opened.locator("#phase")).to_have_text("Running", timeout=JOB_MS)
        loss = opened.locator('#curves .curve[data-metric="loss"]')
        expect(loss).to_have_count(1, timeout=JOB_MS)
        first = int(loss.get_attribute("data-logged") or 0)
        opened.wait_for_function(
            "([first]) => Number(document.querySelector('#curves .curve[data-metric=\"loss\"]').dataset.logged) > first "
            "&& document.querySelector('#phase').textContent === 'Running'", arg=[first], timeout=WAIT_MS)
        assert 0 < first < 60, first
        expect(opened.locator("#phase")).to_have_text("Succeeded", timeout=JOB_MS)
        expect(loss).to_have_attribute("data-logged", "60", timeout=WAIT_MS)
        for rank in (0, 1):  # each rank's newest step, to spot one that lags
            expect(opened.locator(f'#ranks tr[data-rank="{rank}"] .last-step')).to_contain_text("step 60", timeout=WAIT_MS)
        opened.select_option("#rank", "each")  # every rank's curve side by side
        expect(opened.locator('#curves .curve[data-metric="loss"]')).to_contain_text("rank 1", timeout=WAIT_MS)
    finally:
        keep_screenshot(opened, request)
        opened.close()
        running.stop()


def test_a_running_job_s_row_and_its_curve_move_while_it_trains(
        kube_api: Any, space: str, s3: str, board: RunningDashboard, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_job(kube_api, space, "trains", s3, {"phase": "Running", "ready": "2/2", "restarts": 0,
                                           "progress": {"epoch": 1, "step": 10, "loss": 0.5, "percent": 10.0}})
    page.goto(board.url)
    row = page.locator(f'#jobs tr[data-job="{space}/trains"]')
    expect(row.locator(".phase")).to_have_text("Running", timeout=WAIT_MS)
    expect(row.locator(".step")).to_have_text("10")
    set_status(kube_api, space, "trains", {"progress": {"epoch": 2, "step": 20, "loss": 0.25, "percent": 20.0}})
    expect(row.locator(".step")).to_have_text("20", timeout=WAIT_MS)  # from the watch: the page is not reloaded

    log_metrics(monkeypatch, s3, space, "trains", range(0, 30))
    row.locator("a").click()
    loss = page.locator('#curves .curve[data-metric="loss"]')
    expect(loss).to_have_attribute("data-logged", "30", timeout=WAIT_MS)
    expect(page.locator('#curves .curve[data-metric="accuracy"]')).to_have_attribute("data-logged", "30")
    log_metrics(monkeypatch, s3, space, "trains", range(30, 75))
    expect(loss).to_have_attribute("data-logged", "75", timeout=WAIT_MS)  # polled: the curve gains points
    expect(page.locator("#phase")).to_have_text("Running")


def test_a_failed_rank_s_last_words_and_the_gang_restart_before_it_are_shown(
        kube_api: Any, space: str, s3: str, board: RunningDashboard, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_job(kube_api, space, "fails", s3, {"phase": "Running", "ready": "2/2"})
    log_metrics(monkeypatch, s3, space, "fails", range(0, 50), attempt=0)
    client.CoreV1Api(kube_api).create_namespaced_event(space, {
        "metadata": {"generateName": "fails-"}, "type": "Warning", "reason": "RankFailed",
        "message": "rank 1 (pod fails-1) exited 1; the gang restarts", "lastTimestamp": rfc3339_now(),
        "involvedObject": {"kind": api.KIND, "apiVersion": f"{api.GROUP}/{api.VERSION}", "name": "fails",
                           "namespace": space}})
    log_metrics(monkeypatch, s3, space, "fails", range(40, 90), attempt=1)
    set_status(kube_api, space, "fails", {
        "phase": "Failed", "reason": "BackoffLimitExceeded", "message": "rank 1 failed again", "restarts": 1,
        "attempt": 1, "failedRank": {"rank": 1, "pod": "fails-1", "reason": "Error", "exitCode": 1, "kind": "Program",
                                     "attempt": 1, "message": "Traceback (most recent call last):\n"
                                                              "RuntimeError: CUDA error: an illegal memory access"}})
    page.goto(board.link("job", namespace=space, name="fails"))
    expect(page.locator("#phase")).to_have_text("Failed", timeout=WAIT_MS)
    expect(page.locator("#failure")).to_contain_text("RuntimeError: CUDA error: an illegal memory access")
    expect(page.locator("#failure")).to_contain_text("failed rank: rank 1 (pod fails-1): Error")
    mark = page.locator('#marks li[data-attempt="1"]')
    expect(mark).to_contain_text("attempt 1 from step 40", timeout=WAIT_MS)
    expect(mark).to_contain_text("RankFailed: rank 1 (pod fails-1) exited 1")


def test_a_deleted_job_s_log_and_curve_still_load_from_s3(
        kube_api: Any, space: str, s3: str, board: RunningDashboard, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_job(kube_api, space, "gone", s3, {"phase": "Succeeded"})
    log_metrics(monkeypatch, s3, space, "gone", range(0, 20))
    demo.s3_client(s3).put_object(Bucket=BUCKET, Key=f"results/{space}/gone/{layout.log_part(0, 0, 0)}",
                                  Body=b"epoch 0 started\nthe last line rank 0 printed\n")
    page.goto(board.url)  # seen live first: its results prefix is where deleted jobs are looked for
    expect(page.locator(f'#jobs tr[data-job="{space}/gone"]')).to_have_count(1, timeout=WAIT_MS)
    client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(api.GROUP, api.VERSION, space, api.PLURAL, "gone")
    expect(page.locator(f'#jobs tr[data-job="{space}/gone"]')).to_have_count(0, timeout=WAIT_MS)
    page.reload()
    deleted = page.locator(f'#deleted tr[data-job="{space}/gone"]')
    expect(deleted).to_have_count(1, timeout=WAIT_MS)
    deleted.locator("a").click()
    expect(page.locator("#phase")).to_have_text("Deleted", timeout=WAIT_MS)
    expect(page.locator("#log")).to_contain_text("the last line rank 0 printed", timeout=WAIT_MS)
    expect(page.locator('#curves .curve[data-metric="loss"]')).to_have_attribute("data-logged", "20", timeout=WAIT_MS)


def test_a_namespace_the_user_may_not_read_shows_the_api_server_s_refusal(
        kube_api: Any, space: str, browser: Browser, request: pytest.FixtureRequest) -> None:
    stranger = client_as(kube_api, space, "default")  # a ServiceAccount no Role grants anything
    running = ddp_client.dashboard(space, api_client=stranger, s3_access=S3Access())
    opened = browser.new_page()
    try:
        opened.goto(running.url)
        expect(opened.locator("#error")).to_contain_text("403 Forbidden", timeout=WAIT_MS)
        expect(opened.locator("#error")).to_contain_text(f'cannot list resource "{api.PLURAL}"')
        expect(opened.locator("#jobs tbody tr")).to_have_count(0)
        opened.goto(running.link("job", namespace=space, name="trains"))
        expect(opened.locator("#error")).to_contain_text("403 Forbidden", timeout=WAIT_MS)
    finally:
        keep_screenshot(opened, request)
        opened.close()
        running.stop()
        stranger.close()


def test_a_page_under_a_name_rebound_to_this_machine_is_refused(board: RunningDashboard, page: Page) -> None:
    """DNS rebinding: the browser reaches 127.0.0.1 under another site's name; even the token does not help."""
    port = urlsplit(board.address).port
    answer = page.goto(f"http://{REBOUND}:{port}/api/job?namespace=a&name=b&token={board.access.token}")
    assert answer is not None and answer.status == 403
    expect(page.locator("body")).to_contain_text(f"Host '{REBOUND}:{port}' is not this dashboard's address")
    answer = page.goto(f"http://{REBOUND}:{port}/?token={board.access.token}")
    assert answer is not None and answer.status == 403
    expect(page.locator("body")).to_contain_text("DNS rebinding")


def test_a_page_opened_without_the_token_says_how_to_open_it(board: RunningDashboard, page: Page) -> None:
    answer = page.goto(board.address)
    assert answer is not None and answer.status == 403
    expect(page.locator("body")).to_contain_text("needs its token")
    expect(page.locator("body")).to_contain_text("?token=")
    page.goto(board.url)  # the printed address: the page, and its own requests carry the token's cookie
    expect(page.locator("#error")).to_have_text("", timeout=WAIT_MS)
    page.goto(board.address)
    expect(page.locator("#jobs")).to_be_visible(timeout=WAIT_MS)


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """Another site's page, served on loopback at another port (another origin) and stopped after the test."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>elsewhere</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    yield f"http://{REBOUND}:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    serving.join(10)


def test_a_script_of_another_site_cannot_read_the_api(board: RunningDashboard, page: Page, elsewhere: str) -> None:
    """Another site's page in the same browser asks the dashboard's API, even knowing the token: the dashboard
    refuses it (403: the browser says another site started it) and the browser hands the script nothing."""
    page.goto(board.url)  # the user's own tab left the cookie in this browser
    page.goto(elsewhere)
    for path in ("api/config", "api/jobs/events", "api/job"):
        target = board.link(path, namespace="a", name="b")
        with page.expect_response(lambda response: response.url.startswith(board.address + path)) as answered:
            read = page.evaluate("url => fetch(url, {mode: 'no-cors', credentials: 'include'})"
                                 ".then(r => r.type + ':' + r.status)", target)
        assert answered.value.status == 403, path
        assert read == "opaque:0", path  # nothing of the answer reaches the script
        refused = page.evaluate("url => fetch(url, {credentials: 'include'}).then(r => r.text(), e => 'blocked')",
                                target)
        assert refused == "blocked", path


def rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def test_kubectl_ddp_dashboard_serves_until_interrupted(cluster: Any, space: str) -> None:
    """The command prints the page's address, serves the namespace's jobs there and ends cleanly on Ctrl-C."""
    command = [sys.executable, "-m", "ddp_client", "dashboard", "--kubeconfig", cluster.kubeconfig, "-n", space,
               "--port", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("client", "contract"))}
    served = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = served.stdout.readline()  # type: ignore[union-attr]
        url = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=([\w-]+)", line)
        assert url is not None, line
        with urllib.request.urlopen(f"{url.group(1)}api/config?token={url.group(2)}", timeout=10) as answer:
            assert json.load(answer) == {"namespace": space}
        served.send_signal(signal.SIGINT)
        try:
            ended: int | None = served.wait(60)
        except subprocess.TimeoutExpired:  # it did not stop
            ended = None
    finally:
        if served.poll() is None:  # still serving: said below, with what it wrote
            served.kill()
        _, said = served.communicate(timeout=30)
    assert ended == 0, said
