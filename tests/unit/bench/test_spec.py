"""Job specs: validation, the sweep, what is persisted."""

from __future__ import annotations

import pytest

from app.bench.spec import JobSpec
from app.errors import InvalidInput

TABLE = "0 8192 crypt aes-cbc-plain64 " + "11" * 16 + " 0 {dev} 0"


def test_the_sweep_is_a_cartesian_product_with_the_engine_outermost() -> None:
    spec = JobSpec.from_dict(
        {
            "volume_template": {"table": TABLE, "device_size": "4M"},
            "workload": {"rw": "write", "size": "64k"},
            "sweep": {
                "dispatch_mode": ["bio", "request"],
                "bs": ["4k", "8k"],
                "engine": ["a", "b"],
            },
        }
    )
    points = [(p.engine, p.dispatch_mode, p.workload.bs) for p in spec.points()]
    assert points[:3] == [("a", "bio", 4096), ("a", "bio", 8192), ("a", "request", 4096)]
    assert len(points) == 8


def test_the_persisted_spec_zeroes_keys() -> None:
    spec = JobSpec.from_dict({"volume_template": {"table": TABLE}, "workload": {}})
    assert "11" * 16 not in str(spec.to_dict())


@pytest.mark.parametrize(
    "job",
    [
        {},
        {"volume": "v", "volume_template": {"table": TABLE}},
        {"volume_template": {"table": "0 8 zero"}},
        {"volume": "v", "sweep": {"blocksize": [1]}},
        {"volume": "v", "sweep": {"dispatch_mode": ["queue"]}},
        {"volume_template": {"table": TABLE, "device_size": 4096}, "workload": {"size": "1M"}},
    ],
)
def test_bad_specs_are_refused(job: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        JobSpec.from_dict(job)
