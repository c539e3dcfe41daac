"""The guides under docs/ name what the service really has."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import CLUSTER_METRIC
from tests.support.factories import make_device, make_volume

pytestmark = pytest.mark.anyio
DOCS = Path(__file__).resolve().parents[2] / "docs"


async def test_the_api_guide_has_a_curl_line_for_every_path(
    anon_client: httpx.AsyncClient,
) -> None:
    guide = (DOCS / "api.md").read_text()
    curls = [line for line in guide.splitlines() if "curl" in line]
    paths = (await anon_client.get("/openapi.json")).json()["paths"]
    for path in paths:
        pattern = re.escape(path).replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.sub(r"{[a-z_]+}", r"[^/\\s\"?]+", pattern) + r"(?:[\s\"?`]|$)"
        assert any(re.search(pattern, line) for line in curls), path


async def test_the_metrics_named_in_operations_exist(client: httpx.AsyncClient) -> None:
    await make_device(client)
    await make_volume(client)
    await client.put(
        "/v1/volumes/vol/data", content=b"x" * 4096, headers={"Content-Range": "bytes 0-4095/*"}
    )
    exported = (await client.get("/metrics")).text
    named = set(re.findall(r"`(reqcrypt_[a-z_]+)`", (DOCS / "operations.md").read_text()))
    named |= {
        f"reqcrypt_volume_{kind}_total"
        for kind in re.findall(r"`…_([a-z]+)_total`", (DOCS / "operations.md").read_text())
    }
    cluster_only = {name for name in named if CLUSTER_METRIC.match(name)}
    assert len(named - cluster_only) >= 8
    for metric in named - cluster_only:  # a cluster node's: tests/integration/test_cluster.py
        assert re.search(rf"^{metric}(_bucket|_count|_sum)?[{{ ]", exported, flags=re.MULTILINE), (
            metric
        )
