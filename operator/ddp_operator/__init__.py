"""ddp-operator: the kopf operator that runs DDPJobs."""
