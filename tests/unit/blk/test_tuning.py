"""Queue tuning as one value: PATCH keeps what it does not name, bad values are refused."""

from __future__ import annotations

import pytest

from app.blk.limits import QueueLimits
from app.blk.tuning import Tuning, TuningPatch
from app.errors import InvalidInput


def test_a_patch_changes_only_the_fields_it_names() -> None:
    tuning = Tuning(dispatch_mode="bio", elevator="mq-deadline", plug_window_us=7)
    patched = TuningPatch(limits=QueueLimits(max_segments=4)).apply(tuning)
    assert patched == Tuning(
        dispatch_mode="bio",
        elevator="mq-deadline",
        limits=QueueLimits(max_segments=4),
        plug_window_us=7,
    )


def test_an_unset_plug_window_follows_the_service_default() -> None:
    assert Tuning().plug_window(50) == 50
    assert Tuning(plug_window_us=0).plug_window(50) == 0


@pytest.mark.parametrize(
    "tuning",
    [
        Tuning(plug_window_us=-1),
        Tuning(limits=QueueLimits(logical_block_size=768)),
        Tuning(dispatch_mode="bulk"),  # type: ignore[arg-type]
        Tuning(elevator="cfq"),  # type: ignore[arg-type]
    ],
)
def test_invalid_tuning_is_refused(tuning: Tuning) -> None:
    with pytest.raises(InvalidInput):
        tuning.validate()


def test_a_table_block_size_raises_the_logical_block_size_never_lowers_it() -> None:
    tuning = Tuning(limits=QueueLimits(logical_block_size=1024))
    assert tuning.limits_for(4096).logical_block_size == 4096
    assert tuning.limits_for(512) is tuning.limits
