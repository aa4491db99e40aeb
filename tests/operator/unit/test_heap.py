"""When the operator hands memory back: after its caches lost half their objects, and at least RELEASE_AFTER."""

from __future__ import annotations

import gc

from ddp_operator.heap import MALLOC_TRIM, RELEASE_AFTER, Shrinkage, release_memory


def test_memory_is_released_once_half_the_peak_and_at_least_release_after_are_gone() -> None:
    seen = Shrinkage()
    assert not seen.saw(10 * RELEASE_AFTER)
    assert not seen.saw(6 * RELEASE_AFTER), "40% gone is not enough"
    assert seen.saw(5 * RELEASE_AFTER), "half gone is"
    assert seen.peak == 5 * RELEASE_AFTER, "the next release is judged from here"
    assert not seen.saw(4 * RELEASE_AFTER)


def test_small_caches_never_pay_for_a_collection() -> None:
    seen = Shrinkage()
    seen.saw(RELEASE_AFTER - 1)
    assert not seen.saw(0), "fewer than RELEASE_AFTER objects gone, even all of them"


def test_a_gang_deleted_pod_by_pod_releases_a_few_times_not_once_per_pod() -> None:
    seen = Shrinkage()
    releases = [count for count in range(10_000, -1, -1) if seen.saw(count)]
    assert releases == [5000, 2500, 1250, 250]


def _count(cls: type) -> int:
    # type(), not isinstance(): the heap may hold weak proxies whose referents are gone, and isinstance()
    # asks a proxy for its __class__, which raises ReferenceError.
    return sum(type(o) is cls for o in gc.get_objects())


def test_release_memory_collects_cycles_and_trims_glibcs_heaps() -> None:
    class Cycle:
        pass

    gc.disable()
    try:
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        del a, b
        before = _count(Cycle)
        release_memory()
        after = _count(Cycle)
    finally:
        gc.enable()
    assert (before, after) == (2, 0)
    assert MALLOC_TRIM is not None, "glibc's malloc_trim is there on the operator's image (python:3.11-slim)"
