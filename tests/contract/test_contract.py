"""The OpenAPI document is the contract: schemathesis checks it against a real uvicorn.

Every check runs (``schemathesis.toml`` lists the few state-dependent statuses it
tolerates, and why): a response the document does not describe, a request the
document allows that the service refuses, or one it forbids that the service
takes, is a failure. The stateful test follows the document's links from a new
device to a volume on it and on to its data path and lifecycle calls.

Each run draws new inputs from a seed of its own (``SEED``), which every test prints:
``REQCRYPT_CONTRACT_SEED=<seed>`` draws the same inputs again to replay a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events
from schemathesis.specs.openapi.schemas import OpenApiSchema

from app.api.manual import RUN_LINKS, VOLUME_LINKS
from app.config import Settings
from app.main import create_app
from tests.support.app import ADMIN_TOKEN
from tests.support.servers import Server

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).with_name("schemathesis.toml")
SEED = int(os.environ.get("REQCRYPT_CONTRACT_SEED") or secrets.randbits(32))
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
    # A generated luksFormat takes the default PBKDF capped by these: milliseconds, not seconds.
    "REQCRYPT_LUKS_MAX_PBKDF_MEMORY_KIB": "65536",
    "REQCRYPT_LUKS_MAX_PBKDF_ITERATIONS": "100000",
}
# The port is picked now: the schema, built at collection, must name the server's URL.
# The directory is made when the server starts, so collecting alone leaves nothing behind.
SERVER = Server(
    Path(tempfile.gettempdir()) / f"reqcrypt-contract-{uuid.uuid4().hex}" / "data", **ENV
)


def load_schema(seed: int = SEED) -> OpenApiSchema:
    """The document the server will serve: the same app with the same settings; its
    inputs drawn from ``seed``."""
    settings = Settings(
        data_dir=SERVER.data_dir,
        max_device_bytes=1 << 30,
        max_total_device_bytes=1 << 40,
    )
    os.environ["CONTRACT_TOKEN"] = ADMIN_TOKEN  # schemathesis.toml's bearer
    config = SchemathesisConfig.from_path(str(CONFIG))
    config.update(seed=seed, max_failures=config.max_failures)
    document = json.loads(json.dumps(create_app(settings).openapi()))
    loaded = schemathesis.openapi.from_dict(document, config=config)
    loaded.config.update(base_url=SERVER.base)
    return loaded


schema = load_schema()

# Calls only a link can make succeed: on the volume a create just made, on a run.
ON_VOLUME = {f"{method.upper()} {path}" for method, path in VOLUME_LINKS.values()}
ON_RUN = {f"{method.upper()} {path}" for method, path in RUN_LINKS.values()}
WALKS = 6
"""Stateful walks, from seeds ``SEED``, ``SEED + 1``…, until the links have led past
creation: about two walks in three get there, each in about 3 s."""


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


@pytest.fixture(autouse=True)
def replay_hint(request: pytest.FixtureRequest) -> None:
    """Shown with a failure (a report section): how to draw the same inputs again."""
    hint = f"contract seed {SEED}: REQCRYPT_CONTRACT_SEED={SEED} replays this run's inputs"
    request.node.add_report_section("setup", "seed", hint)


@pytest.mark.slow
@schema.parametrize()
def test_operation(case: Any) -> None:
    """Examples, coverage and fuzzing phases, one operation at a time."""
    case.call_and_validate()


def walk(seed: int) -> tuple[list[str], set[str]]:
    """One stateful walk from ``seed``: its check failures, and the calls that succeeded.

    Run by schemathesis's own engine, as ``schemathesis run`` does: the service keeps
    its state between scenarios (a name taken, a benchmark still running), so one
    Hypothesis state machine sees different choices on a replay and calls it flaky;
    the engine re-runs such a scenario instead and reports only check failures.
    """
    walked = load_schema(seed)
    walked.config.phases.update(phases=["stateful"])
    failures: list[str] = []
    reached: set[str] = set()
    for event in schemathesis.engine.from_schema(walked).execute():
        if isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(f"error: {event}")
        if not isinstance(event, events.ScenarioFinished):
            continue
        recorder = event.recorder
        for case_id, interaction in recorder.interactions.items():
            response = interaction.response
            if response is not None and response.status_code < 300:
                case = recorder.cases[case_id].value
                reached.add(f"{case.method} {case.operation.path}")
        for checks in recorder.checks.values():
            for check in checks:
                if check.failure_info is not None:
                    failure = check.failure_info.failure
                    failures.append(
                        f"{failure.code} {failure.title} ({failure.operation}): "
                        f"{failure.message}\n{check.failure_info.code_sample}"
                    )
    return failures, reached


def past_creation(reached: set[str]) -> bool:
    """The links led past creation (which calls they take varies with the service's
    timing): a volume on a new device, then calls on it; a run, then its results."""
    created = {"POST /v1/devices", "POST /v1/volumes"} <= reached
    return created and bool(reached & ON_VOLUME) and bool(reached & ON_RUN)


@pytest.mark.slow
def test_stateful() -> None:
    """Sequences that follow the links: device -> volume -> data and lifecycle calls,
    and benchmark runs -> their results; every check holds on every walk."""
    failures: list[str] = []
    reached: set[str] = set()
    for seed in range(SEED, SEED + WALKS):
        found, succeeded = walk(seed)
        failures += found
        reached |= succeeded
        if failures or past_creation(reached):
            break
    assert not failures, "\n\n".join(failures)
    assert past_creation(reached), sorted(reached)
