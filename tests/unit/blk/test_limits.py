import pytest

from app.blk import QueueLimits
from app.errors import InvalidInput


def test_defaults_are_valid_and_max_sectors_is_in_sectors():
    limits = QueueLimits().validate()
    assert limits.max_sectors == 2560


def test_max_sectors_rounds_down_to_logical_block():
    assert QueueLimits(max_sectors_kb=7, logical_block_size=4096).max_sectors == 8


@pytest.mark.parametrize(
    "fields",
    [
        {"logical_block_size": 256},
        {"logical_block_size": 1536},
        {"logical_block_size": 8192},
        {"max_sectors_kb": 2, "logical_block_size": 4096},
        {"max_sectors_kb": 0},
        {"max_segments": 0},
        {"max_segment_size": 1024},
        {"nomerges": 3},
    ],
)
def test_nonsense_is_refused(fields):
    with pytest.raises(InvalidInput):
        QueueLimits(**fields).validate()
