"""Submit, watch and collect DDPJobs from a notebook or a script, and `kubectl ddp`.

    import ddp_client
    job = ddp_client.submit("train.py", image="ddp-operator/trainer:0.1.0", world_size=4, gpus=1,
                            s3=ddp_client.S3(endpoint=..., credentials_secret=..., results="s3://bucket/runs"))
    job.wait()                  # a progress line, then the outcome (and on failure, why)
    print(job.logs())           # every rank's output, `[rank N] ` before each line
    job.results(download="out") # what the ranks submitted
    job.plot("loss.png")
    ddp_client.dashboard()      # live pages of the namespace's jobs, served on this machine (its .url)

Imports only ddp_contract, kubernetes, boto3, PyYAML and (for plots) matplotlib: never the operator
or the trainer runtime.
"""

from __future__ import annotations

from .job import Job, JobDeleted, JobFailed, process_results
from .jobspec import S3
from .submit import attach, submit
from .web import dashboard

__all__ = ["Job", "JobDeleted", "JobFailed", "S3", "attach", "dashboard", "process_results", "submit"]
