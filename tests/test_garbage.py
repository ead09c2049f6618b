"""The collector's settings the server applies once started (``proxy.garbage``)."""

from __future__ import annotations

import gc

from proxy.garbage import OLDER_THRESHOLDS, YOUNG_THRESHOLD, tune_garbage_collector


def test_start_up_objects_are_frozen_and_young_collections_are_rarer():
    thresholds = gc.get_threshold()
    try:
        kept = [{"start-up": [1, 2]}]  # a container that exists before the tuning
        tune_garbage_collector()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
        assert gc.get_freeze_count() > 0
        assert not any(obj is kept[0] for obj in gc.get_objects())  # no collection walks it
        later = [[3]]
        assert any(obj is later for obj in gc.get_objects(generation=0))
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
