"""The restart modes' rooms: what each reads of a job's pods and decides, beside the generic summary
(gangpods.py) and the decision that puts them in order (decision.py).

    recreate.py  restartStrategy Recreate: a restart deletes the whole gang; the next attempt is new pods
    inplace.py   restartStrategy InPlace: pods kept across attempts, rank processes that failed in them,
                 the deadline for a kept gang to form again
    elastic.py   minWorldSize below worldSize: the gang's members, the pods waiting apart, resizes

The rooms import the generic modules, never each other (an import-linter contract).
"""
