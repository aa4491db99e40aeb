"""What the end-to-end tests share: the S3 bucket their jobs use (the fixtures are in tests/e2e/conftest.py)."""

from __future__ import annotations

BUCKET = "ddp-e2e"
