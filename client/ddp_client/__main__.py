"""`python -m ddp_client ...`: the same as `kubectl ddp ...`."""

from .cli import cli

cli()
