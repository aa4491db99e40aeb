"""What the operator and the ranks agree on: the API, labels, env var names, exit codes, backend rule.

Both sides import this package and nothing else of each other's. It imports no torch, boto3 or
kubernetes (kubeclient.py loads kubernetes only when called), so the operator image copies it whole.
"""
