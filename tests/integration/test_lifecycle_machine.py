"""The volume lifecycle as a state machine, against a model, across restarts.

Hypothesis drives random sequences of dmsetup operations (load, clear, suspend,
resume, key wipe/set, retune, restart) on a real ``Control`` over SQLite or the
real PostgreSQL; after every step the in-memory state, and after every restart
the state rebuilt from SQL, must equal the model's.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from app.control import Control
from app.db import migrate
from app.db.queries import SqlRegistryStore
from app.db.session import make_engine, make_sessionmaker
from app.dm.table import format_table
from app.engine.registry import EngineRegistry
from app.errors import InvalidState, KeyNotSet
from app.storage.registry import DeviceRegistry
from tests.conftest import POSTGRES_ADMIN_DSN

KEY_A = bytes(range(64)).hex()
KEY_B = bytes(range(64, 128)).hex()
MASTER = bytes(32)


def table(key: str, sectors: int) -> str:
    return f"0 {sectors} crypt aes-xts-plain64 {key} 0 pv 0"


def fresh_database(backend: str) -> tuple[str, Path]:
    """A new database and data directory for one example."""
    directory = Path(tempfile.mkdtemp())
    if backend == "sqlite":
        return f"sqlite:///{directory / 'm.db'}", directory
    name = f"reqcrypt_m_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{POSTGRES_ADMIN_DSN.rsplit('/', 1)[0]}/{name}", directory


def drop_database(url: str) -> None:
    if url.startswith("postgresql"):
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Lifecycle(RuleBasedStateMachine):
    backend = "sqlite"

    @initialize()
    def start(self) -> None:
        self.url, self.data_dir = fresh_database(self.backend)
        migrate.upgrade(self.url)
        self.db = make_engine(self.url)
        self.control = self._control()
        self.control.create_device("pv", 1 << 20, None)
        self.control.create_volume("v", table(KEY_A, 2048))
        self.model: dict[str, Any] = {
            "state": "active",
            "live": table(KEY_A, 2048),
            "inactive": None,
            "wiped": False,
            "mode": "request",
        }

    def _control(self) -> Control:
        sessions = make_sessionmaker(self.db)
        control = Control(
            sessions,
            DeviceRegistry(self.data_dir / "devices"),
            EngineRegistry(SqlRegistryStore(sessions)),
            MASTER,
            plug_window_us=0,
            suspend_wait_seconds=0.05,
        )
        control.restore()
        return control

    def teardown(self) -> None:
        if hasattr(self, "control"):
            self.control.close()
            self.db.dispose()
            drop_database(self.url)

    @rule(sectors=st.sampled_from([1024, 2048]), key=st.sampled_from([KEY_A, KEY_B]))
    def load(self, sectors: int, key: str) -> None:
        self.control.load_table("v", table(key, sectors))
        self.model["inactive"] = table(key, sectors)

    @rule()
    def clear(self) -> None:
        self.control.clear_inactive("v")
        self.model["inactive"] = None

    @rule(noflush=st.booleans())
    def suspend(self, noflush: bool) -> None:
        self.control.suspend("v", noflush=noflush)
        self.model["state"] = "suspended"

    @rule()
    def resume(self) -> None:
        try:
            self.control.resume("v")
        except KeyNotSet:
            assert self.model["wiped"]
            assert self.model["inactive"] is None
            return
        if self.model["inactive"] is not None:
            self.model["live"], self.model["inactive"] = self.model["inactive"], None
            self.model["wiped"] = False
        self.model["state"] = "active"

    @rule()
    def wipe(self) -> None:
        try:
            self.control.message("v", "key wipe")
        except InvalidState:
            assert self.model["state"] == "active"
            return
        self.model["wiped"] = True

    @precondition(lambda self: self.model["state"] == "suspended")
    @rule(key=st.sampled_from([KEY_A, KEY_B]))
    def set_key(self, key: str) -> None:
        self.control.message("v", f"key set {key}")
        sectors = int(self.model["live"].split()[1])
        self.model["live"] = table(key, sectors)
        self.model["wiped"] = False

    @rule(mode=st.sampled_from(["bio", "request"]))
    def retune(self, mode: str) -> None:
        self.control.retune("v", dispatch_mode=mode)  # type: ignore[arg-type]
        self.model["mode"] = mode

    @rule()
    def restart(self) -> None:
        self.control.close()
        self.control = self._control()

    @invariant()
    def matches_the_model(self) -> None:
        if not hasattr(self, "control"):
            return
        volume = self.control.volume("v")
        assert volume.state == self.model["state"]
        assert volume.dispatch_mode == self.model["mode"]
        assert volume.live is not None
        live = format_table(volume.live.table, show_keys=True)
        if self.model["wiped"]:
            sectors = self.model["live"].split()[1]
            assert live == f"0 {sectors} crypt aes-xts-plain64 {'0' * 128} 0 pv 0\n"
        else:
            assert live == self.model["live"] + "\n"
        inactive = volume.inactive
        expected = self.model["inactive"]
        if expected is None:
            assert inactive is None
        else:
            assert inactive is not None
            assert format_table(inactive, show_keys=True) == expected + "\n"


def run_machine(backend: str, examples: int) -> None:
    class Machine(Lifecycle):
        pass

    Machine.backend = backend
    runner = Machine.TestCase()
    runner.settings = settings(
        max_examples=examples,
        stateful_step_count=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    runner.runTest()


def test_lifecycle_matches_the_model_across_restarts_on_sqlite() -> None:
    run_machine("sqlite", 25)


@pytest.mark.postgres
def test_lifecycle_matches_the_model_across_restarts_on_postgres(postgres_url: str) -> None:
    del postgres_url  # proves the server is reachable; each example makes its own database
    run_machine("postgres", 8)
