"""`kubectl ddp` (the executable `kubectl-ddp`): logs, results, plot and status of a DDPJob; a live web
dashboard of the jobs; convert a PyTorchJob to one."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from kubernetes.client.rest import ApiException
from kubernetes.config import ConfigException
from urllib3.exceptions import HTTPError

from .convert import ConvertError, from_pytorchjob
from .job import Job
from .store import S3Access, StoreError
from .submit import attach
from .web import PORT as DASHBOARD_PORT


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kubectl ddp", description="Logs, results, metrics and status of DDPJobs; "
                                  "a PyTorchJob converted to one.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("job", help="the DDPJob's name")
    common.add_argument("-n", "--namespace", help="the job's namespace (default: the kubeconfig context's)")
    common.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    common.add_argument("--results", metavar="S3_URI",
                        help="the job's spec.s3.results, to read a deleted job's logs, results and metrics")
    common.add_argument("--s3-endpoint", help="S3 endpoint (default: the job's spec.s3.endpoint, $DDP_S3_ENDPOINT)")
    common.add_argument("--s3-region", help="S3 region (default: the job's spec.s3.region)")
    common.add_argument("--s3-access-key-id", help="(default: the job's credentials Secret, $AWS_ACCESS_KEY_ID)")
    common.add_argument("--s3-secret-access-key", help="(default: the job's credentials Secret, $AWS_SECRET_ACCESS_KEY)")
    commands = top.add_subparsers(dest="command", required=True)
    logs = commands.add_parser("logs", parents=[common], help="every rank's output, merged with [rank N] prefixes")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job finishes")
    logs.add_argument("--rank", type=int, help="only this rank")
    logs.add_argument("--attempt", type=int, help="this gang attempt (default: the pods', else the last kept)")
    results = commands.add_parser("results", parents=[common],
                                  help="list (or download) what the ranks submitted and the folders the job keeps")
    results.add_argument("--download", metavar="DIR",
                         help="download every result under DIR, and the kept folders under DIR/kept/")
    plot = commands.add_parser("plot", parents=[common], help="loss and logged metrics against the step, to a PNG")
    plot.add_argument("-o", "--output", required=True, help="the PNG to write")
    plot.add_argument("--metric", action="append", help="only this metric (repeatable; default: all)")
    plot.add_argument("--rank", type=int, default=0, help="whose metrics (default 0; -1: mean of all ranks)")
    commands.add_parser("status", parents=[common], help="phase, ranks by state, progress, checkpoint, failure")
    board = commands.add_parser("dashboard", help="a web page of the jobs, live, served on this machine until Ctrl-C")
    board.add_argument("-n", "--namespace", help="the namespace shown (default: the kubeconfig context's)")
    board.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace you can list")
    board.add_argument("--port", type=int, default=DASHBOARD_PORT, help=f"on 127.0.0.1 (default {DASHBOARD_PORT}; 0: any free)")
    board.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    board.add_argument("--results", metavar="S3_URI", action="append", default=[],
                       help="a results prefix (spec.s3.results) where deleted jobs are looked for (repeatable)")
    board.add_argument("--accept-host", metavar="NAME", action="append", default=[],
                       help="also answer requests for this Host name, as a trusted proxy in front sends them "
                            "(repeatable; default: only 127.0.0.1 and localhost)")
    board.add_argument("--no-token", action="store_true",
                       help="serve without the token in the printed URL, for a trusted proxy that checks who "
                            "comes (anyone who reaches the port can then read what your credentials can)")
    convert = commands.add_parser("convert", help="a Kubeflow PyTorchJob manifest as a DDPJob (YAML on stdout)")
    convert.add_argument("-f", "--filename", required=True, help="the PyTorchJob's YAML file, or - for stdin")
    return top


def convert_file(path: str) -> int:
    """`kubectl ddp convert -f FILE`: the DDPJob on stdout, what was not carried over on stderr."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    conversion = from_pytorchjob(yaml.safe_load(text) or {})
    sys.stdout.write(yaml.safe_dump(conversion.job, sort_keys=False))
    for note in conversion.notes:
        print(f"kubectl ddp convert: not carried over: {note}", file=sys.stderr)
    return 0


def s3_access(args: argparse.Namespace) -> S3Access:
    """Flags first, then the environment; the job's own settings fill in the rest (Job.store)."""
    flags = S3Access(endpoint=args.s3_endpoint, region=args.s3_region or "",
                     access_key_id=args.s3_access_key_id, secret_access_key=args.s3_secret_access_key)
    return flags.over(S3Access.from_env())


def run(job: Job, args: argparse.Namespace) -> int:
    if args.command == "status":
        print(job.summary())
    elif args.command == "logs":
        if args.follow:
            job.logs(rank=args.rank, attempt=args.attempt, follow=True, out=sys.stdout)
        else:
            sys.stdout.write(job.logs(rank=args.rank, attempt=args.attempt))
    elif args.command == "results":
        if args.download:
            for path in [*job.results(download=args.download), *job.kept(download=Path(args.download) / "kept")]:
                print(path)
        else:
            for item in job.results():
                print(f"{item.size:>12}  {item.path}")
            for kept in job.kept():
                print(f"{kept.size:>12}  kept/{kept.path}")
    elif args.command == "plot":
        series = job.plot(args.output, metrics=args.metric, rank=None if args.rank == -1 else args.rank)
        print(f"{args.output}: {', '.join(f'{name} ({len(points)} points)' for name, points in series.items())}")
    return 0


def serve_dashboard(args: argparse.Namespace) -> int:
    """`kubectl ddp dashboard`: serves until Ctrl-C."""
    import signal
    import threading

    from .web import dashboard

    stopped = threading.Event()  # set by Ctrl-C or a SIGTERM, whenever it comes (even before the URL is printed)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stopped.set())
    try:
        board = dashboard(args.namespace, args.all_namespaces, args.port, args.kubeconfig, results=tuple(args.results),
                          token=not args.no_token, accept_hosts=tuple(args.accept_host))
    except OSError as error:
        print(f"kubectl ddp dashboard: cannot serve on 127.0.0.1:{args.port}: {error.strerror or error}"
              " (another --port, or 0 for any free one)", file=sys.stderr)
        return 1
    try:
        print(f"DDPJob dashboard: {board.url} (Ctrl-C stops it)", flush=True)
        while not stopped.wait(1):
            pass
    finally:
        board.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries' warnings: the one line below says it
    job: Job | None = None
    if args.command == "dashboard":
        try:
            return serve_dashboard(args)
        except ConfigException as error:
            print(f"kubectl ddp dashboard: no usable kubeconfig: {error}", file=sys.stderr)
            return 1
        except ModuleNotFoundError as error:
            print(f"kubectl ddp dashboard: needs {error.name}, which comes with the client's extras: "
                  "pip install 'ddp-operator[client]'", file=sys.stderr)
            return 1
    if args.command == "convert":
        try:
            return convert_file(args.filename)
        except (OSError, yaml.YAMLError, ConvertError) as error:
            print(f"kubectl ddp convert: {error}", file=sys.stderr)
            return 1
    try:
        job = attach(args.job, args.namespace, args.kubeconfig, s3_access=s3_access(args), results_uri=args.results)
        return run(job, args)
    except (LookupError, StoreError, ValueError) as error:
        print(f"kubectl ddp {args.command}: {error}", file=sys.stderr)
        return 1
    except ConfigException as error:
        print(f"kubectl ddp {args.command}: no usable kubeconfig: {error}", file=sys.stderr)
        return 1
    except ApiException as error:
        print(f"kubectl ddp {args.command}: the Kubernetes API answered {error.status} {error.reason}: "
              f"{(error.body or '')[:500]}", file=sys.stderr)
        return 1
    except HTTPError as error:
        where = f" at {job.api_client.configuration.host}" if job is not None else ""
        print(f"kubectl ddp {args.command}: cannot reach the Kubernetes API{where}: {getattr(error, 'reason', None) or error}",
              file=sys.stderr)
        return 1
    except ModuleNotFoundError as error:
        print(f"kubectl ddp {args.command}: needs {error.name}, which comes with the client's extras: "
              "pip install 'ddp-operator[client]'", file=sys.stderr)
        return 1


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
