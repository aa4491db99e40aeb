"""The restart modes' rooms: what each reads of a job's pods and decides, beside the generic summary
(gangpods.py) and the decision that puts them in order (decision.py).

    recreate.py  restartStrategy Recreate: a restart deletes the whole gang; the next attempt is new pods
    inplace.py   restartStrategy InPlace: pods kept across attempts, rank processes that failed in them,
                 the deadline for a kept gang to form again
    elastic.py   minWorldSize below worldSize: the gang's members, the pods waiting apart, resizes
    spares.py    spec.sparePods: the gang's members, a spare in a lost pod's place
    mode.py      the job's mode as one object, picked once from its spec (`of`), which the rest of the
                 operator asks what the mode does (which pods a restart replaces, the gang's members, ...)

The rooms import the generic modules, never each other (an import-linter contract); mode.py alone
imports them all.
"""

from ddp_operator.modes.mode import Elastic, InPlace, Mode, Recreate, Spared, of

__all__ = ["Elastic", "InPlace", "Mode", "Recreate", "Spared", "of"]
