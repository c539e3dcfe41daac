"""The error vocabulary: every error named once, every name mapped by every front end."""

from __future__ import annotations

import pytest

from app import errors
from app.api.problems import HTTP_STATUS
from app.io.status import IoStatus, status_of
from app.nbd.protocol import Errno
from app.nbd.server import ERRNO


@pytest.mark.parametrize("front_end", [HTTP_STATUS, ERRNO], ids=["http", "nbd"])
def test_every_status_is_mapped_by_every_front_end(front_end: dict[IoStatus, int]) -> None:
    assert set(front_end) == set(IoStatus)


@pytest.mark.parametrize(
    ("error", "status", "errno"),
    [
        (errors.InvalidRange("bad"), 400, Errno.EINVAL),
        (errors.RangeNotSatisfiable("beyond", 512), 416, Errno.EINVAL),
        (errors.LeaseExpired("moved"), 503, Errno.EIO),
        (errors.InsufficientStorage("full"), 507, Errno.ENOSPC),
        (errors.TargetIOError("error target"), 500, Errno.EIO),
        (OSError("disk"), 500, Errno.EIO),
    ],
)
def test_an_error_means_one_thing_to_http_and_nbd(
    error: Exception, status: int, errno: Errno
) -> None:
    assert (HTTP_STATUS[status_of(error)], ERRNO[status_of(error)]) == (status, errno)


def test_a_failed_batch_is_named_by_its_first_failure() -> None:
    cause = errors.Unavailable("suspended")
    assert status_of(errors.BatchFailed("1 of 2 parts failed", cause, [])) is IoStatus.AGAIN
