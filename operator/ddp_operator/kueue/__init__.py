"""Kueue, for DDPJobs labelled with a LocalQueue: the gang runs only while Kueue admits it whole.

rules.py: what the job's Workload looks like and what its status means (pure); workloads.py: the
operator's watch of its Workloads; gate.py: what the reconciler asks and does (`KueueGate`).
"""
