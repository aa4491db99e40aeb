"""What runs a rank: `python -m ddp_trainer run` (entrypoint) and what it starts around the user's code.

Joining the gang (rendezvous), loading the target, the rank's context, how failures become exit
codes and last words, SIGTERM, leaving the process; the local-rank supervisor of pods of several
ranks; the heartbeat and hang watch; progress reports, the termination message and the kept log.
May import `data` and `storage`; neither imports this package.
"""
