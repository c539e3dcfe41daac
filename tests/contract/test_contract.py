"""The OpenAPI document is the contract: schemathesis checks it against a real uvicorn.

Every check runs (``schemathesis.toml`` lists the few state-dependent statuses it
tolerates, and why): a response the document does not describe, a request the
document allows that the service refuses, or one it forbids that the service
takes, is a failure. The stateful test follows the document's links from a new
device to a volume on it and on to its data path and lifecycle calls.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.schemas import OpenApiSchema

from app.config import Settings
from app.main import create_app
from tests.conftest import ADMIN_TOKEN
from tests.integration.test_e2e_data import Server

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).with_name("schemathesis.toml")
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

# A batch write's body: bytes as they are (the multipart framing is the service's to check).
schemathesis.serializer.alias("multipart/byteranges", "application/octet-stream")


ENV = {
    # I/O on a suspended volume answers 503 after this wait, not after the default 30 s.
    "REQCRYPT_SUSPEND_WAIT_SECONDS": "0.2",
    # Sparse files of the document's largest size fit any file system; the total allows
    # every device at that size, so 507 (a total over all devices) cannot occur.
    "REQCRYPT_MAX_DEVICE_BYTES": str(1 << 30),
    "REQCRYPT_MAX_TOTAL_DEVICE_BYTES": str(1 << 40),
}
# The port is picked now: the schema, built at collection, must name the server's URL.
SERVER = Server(Path(tempfile.mkdtemp(prefix="reqcrypt-contract-")) / "data", **ENV)


def load_schema() -> OpenApiSchema:
    """The document the server will serve: the same app with the same settings."""
    settings = Settings(
        data_dir=SERVER.data_dir,
        max_device_bytes=1 << 30,
        max_total_device_bytes=1 << 40,
    )
    config = SchemathesisConfig.from_path(str(CONFIG))
    config.projects.get_default().update(headers=HEADERS)
    document = json.loads(json.dumps(create_app(settings).openapi()))
    loaded = schemathesis.openapi.from_dict(document, config=config)
    loaded.config.update(base_url=SERVER.base)
    return loaded


schema = load_schema()


@pytest.fixture(scope="module", autouse=True)
def server() -> Iterator[Server]:
    SERVER.start()
    try:
        served = httpx.get(f"{SERVER.base}/openapi.json", timeout=30).json()
        assert served == schema.raw_schema, "the schema under test is not the one served"
        yield SERVER
    finally:
        SERVER.stop()
        shutil.rmtree(SERVER.data_dir.parent, ignore_errors=True)


@schema.parametrize()
def test_operation(case: Any) -> None:
    """Examples, coverage and fuzzing phases, one operation at a time."""
    case.call_and_validate()


def test_stateful() -> None:
    """Sequences that follow the links: device -> volume -> data, lifecycle, benchmarks."""
    schema.as_state_machine().run(
        settings=hypothesis.settings(
            max_examples=20,
            stateful_step_count=12,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
    )
