"""Where bytes live: S3 (clients, retries, errors that name keys), parallel ranged reads, one URL
layer over s3:// and local paths, the job's results and metrics, and checkpoints.

Imports neither `data` nor `runtime`.
"""
