"""The volume lifecycle as a state machine, against a model, across restarts.

Hypothesis drives random sequences of dmsetup operations (create, load, clear,
suspend, resume, key wipe/set, retune, rename, remove, restart) on several volumes
stacked onto each other, on a real ``Control`` over SQLite or the real
PostgreSQL; after every step the in-memory state, and after every restart the
state rebuilt from SQL, must equal the model's.
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

from app.blk.tuning import TuningPatch
from app.control import Control
from app.db import migrate
from app.db.session import make_engine, make_sessionmaker
from app.dm.table import format_table, parse_table
from app.errors import AlreadyExists, InvalidInput, InvalidState, KeyNotSet, VolumeBusy
from tests.support.control import make_control
from tests.support.database import POSTGRES_ADMIN_DSN, copy_database

KEY_A = bytes(range(64)).hex()
KEY_B = bytes(range(64, 128)).hex()


def table(key: str, sectors: int) -> str:
    return f"0 {sectors} crypt aes-xts-plain64 {key} 0 pv 0"


def fresh_database(backend: str, template: Path | str) -> tuple[str, Path]:
    """A new database and data directory for one example, a copy of the session's
    migrated template (a SQLite file, or a PostgreSQL database by name), so the
    example's migration finds it at head."""
    directory = Path(tempfile.mkdtemp())
    if backend == "sqlite":
        assert isinstance(template, Path)
        return copy_database(template, directory), directory
    name = f"reqcrypt_m_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return f"{POSTGRES_ADMIN_DSN.rsplit('/', 1)[0]}/{name}", directory


def drop_database(url: str) -> None:
    if url.startswith("postgresql"):
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


NAMES = ("a", "b", "c", "d")


def linear_over(volume: str) -> str:
    return f"0 1024 linear /dev/mapper/{volume} 0"


def expected_text(text: str, wiped: bool) -> str:
    """dmsetup's print of ``text``: a wiped key prints as zeros of its length."""
    printed = format_table(parse_table(text), show_keys=True)
    if wiped:
        for key in (KEY_A, KEY_B):
            printed = printed.replace(key, "0" * len(key))
    return printed


def has_volumes(machine: Lifecycle) -> bool:
    return bool(machine.model)


class Lifecycle(RuleBasedStateMachine):
    """Several volumes, stacked onto each other (live and inactive tables), renamed and removed.

    Each rule asks the real ``Control`` and checks its answer against the model
    where the model knows it (cycles, a missing key); a rename or remove the
    service accepts is applied to the model as given, so a wrong "who maps whom"
    shows up as a table naming a missing volume, or as a restart that fails.
    """

    backend = "sqlite"
    template: Path | str = ""

    @initialize()
    def start(self) -> None:
        self.url, self.data_dir = fresh_database(self.backend, self.template)
        migrate.upgrade(self.url)
        self.db = make_engine(self.url)
        self.control = self._control()
        self.control.create_device("pv", 1 << 20, None)
        self.model: dict[str, dict[str, Any]] = {}
        for name, text in (("a", table(KEY_A, 2048)), ("b", "0 1024 zero")):
            self.control.create_volume(name, text)
            self.model[name] = self._fresh(text)

    @staticmethod
    def _fresh(text: str) -> dict[str, Any]:
        return {
            "state": "active",
            "live": text,
            "inactive": None,
            "wiped": False,
            "mode": "request",
        }

    def _control(self) -> Control:
        sessions = make_sessionmaker(self.db)
        return make_control(sessions, self.data_dir / "devices")

    def teardown(self) -> None:
        if hasattr(self, "control"):
            self.control.close()
            self.db.dispose()
            drop_database(self.url)

    def _tables(self, name: str) -> list[str]:
        entry = self.model[name]
        return [text for text in (entry["live"], entry["inactive"]) if text is not None]

    def _users(self, name: str) -> list[str]:
        """Volumes whose live or inactive table maps ``name``, per the model."""
        return sorted(
            other
            for other in self.model
            if any(f"/dev/mapper/{name} " in text for text in self._tables(other))
        )

    def _reaches(self, start: str, goal: str) -> bool:
        pending, seen = [start], set()
        while pending:
            current = pending.pop()
            if current == goal:
                return True
            if current in seen or current not in self.model:
                continue
            seen.add(current)
            pending.extend(
                v
                for v in self.model
                if any(f"/dev/mapper/{v} " in text for text in self._tables(current))
            )
        return False

    def _table_choice(self, data: st.DataObject) -> str:
        plain = st.sampled_from([table(KEY_A, 2048), table(KEY_B, 1024), "0 1024 zero"])
        if not self.model:
            return data.draw(plain)
        stacked = st.sampled_from([linear_over(name) for name in sorted(self.model)])
        return data.draw(plain | stacked)

    def _some_volume(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.model)))

    def _mapped_volume(self, data: st.DataObject) -> str:
        """Half the time a volume some table maps: the case rename and remove must refuse."""
        mapped = [name for name in sorted(self.model) if self._users(name)]
        if not mapped:
            return self._some_volume(data)
        return data.draw(st.sampled_from(mapped) | st.sampled_from(sorted(self.model)))

    @precondition(lambda self: len(self.model) < len(NAMES))
    @rule(data=st.data())
    def create(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n in NAMES if n not in self.model]))
        text = self._table_choice(data)
        self.control.create_volume(name, text)
        self.model[name] = self._fresh(text)

    @precondition(has_volumes)
    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        self._load(self._some_volume(data), self._table_choice(data))

    @precondition(has_volumes)
    @rule(data=st.data())
    def stack(self, data: st.DataObject) -> None:
        """Load a table that maps another volume: the inactive edge rename must respect."""
        self._load(self._some_volume(data), linear_over(self._some_volume(data)))

    def _load(self, name: str, text: str) -> None:
        mapped = parse_table(text).volume_names()
        if any(self._reaches(other, name) for other in mapped):
            with pytest.raises(InvalidInput):
                self.control.load_table(name, text)
            return
        self.control.load_table(name, text)
        self.model[name]["inactive"] = text

    @precondition(has_volumes)
    @rule(data=st.data())
    def clear(self, data: st.DataObject) -> None:
        name = self._some_volume(data)
        self.control.clear_inactive(name)
        self.model[name]["inactive"] = None

    @precondition(has_volumes)
    @rule(data=st.data(), noflush=st.booleans())
    def suspend(self, data: st.DataObject, noflush: bool) -> None:
        name = self._some_volume(data)
        self.control.suspend(name, noflush=noflush)
        self.model[name]["state"] = "suspended"

    @precondition(has_volumes)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        name = self._some_volume(data)
        entry = self.model[name]
        try:
            self.control.resume(name)
        except KeyNotSet:
            assert entry["wiped"]
            assert entry["inactive"] is None
            return
        if entry["inactive"] is not None:
            entry["live"], entry["inactive"] = entry["inactive"], None
            entry["wiped"] = False
        entry["state"] = "active"

    @precondition(has_volumes)
    @rule(data=st.data())
    def wipe(self, data: st.DataObject) -> None:
        name = self._some_volume(data)
        entry = self.model[name]
        try:
            self.control.message(name, "key wipe")
        except InvalidState:
            assert entry["state"] == "active"
            return
        except InvalidInput:
            assert " crypt " not in entry["live"]
            return
        entry["wiped"] = True

    @precondition(has_volumes)
    @rule(data=st.data(), key=st.sampled_from([KEY_A, KEY_B]))
    def set_key(self, data: st.DataObject, key: str) -> None:
        name = self._some_volume(data)
        entry = self.model[name]
        if entry["state"] != "suspended" or " crypt " not in entry["live"]:
            return
        self.control.message(name, f"key set {key}")
        sectors = int(entry["live"].split()[1])
        entry["live"] = table(key, sectors)
        entry["wiped"] = False

    @precondition(has_volumes)
    @rule(data=st.data(), mode=st.sampled_from(["bio", "request"]))
    def retune(self, data: st.DataObject, mode: str) -> None:
        name = self._some_volume(data)
        self.control.retune(name, patch=TuningPatch(dispatch_mode=mode))  # type: ignore[arg-type]
        self.model[name]["mode"] = mode

    @precondition(has_volumes)
    @rule(data=st.data())
    def rename(self, data: st.DataObject) -> None:
        name = self._mapped_volume(data)
        new_name = data.draw(st.sampled_from([n for n in NAMES if n not in self.model] + [name]))
        if new_name in self.model:
            with pytest.raises(AlreadyExists):
                self.control.rename(name, new_name)
            return
        try:
            self.control.rename(name, new_name)
        except VolumeBusy:
            assert self._users(name)
            return
        self.model[new_name] = self.model.pop(name)

    @precondition(has_volumes)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        name = self._mapped_volume(data)
        try:
            self.control.remove(name)
        except VolumeBusy:
            assert self._users(name)
            return
        del self.model[name]

    @rule()
    def restart(self) -> None:
        self.control.close()
        self.control = self._control()

    @invariant()
    def no_table_names_a_missing_volume(self) -> None:
        if not hasattr(self, "control"):
            return
        for name in self.model:
            for text in self._tables(name):
                assert parse_table(text).volume_names() <= set(self.model), (name, text)

    @invariant()
    def matches_the_model(self) -> None:
        if not hasattr(self, "control"):
            return
        assert sorted(self.control.volumes) == sorted(self.model)
        for name, entry in self.model.items():
            volume = self.control.volume(name)
            assert volume.state == entry["state"]
            assert volume.dispatch_mode == entry["mode"]
            assert volume.live is not None
            live = format_table(volume.live.table, show_keys=True)
            assert live == expected_text(entry["live"], entry["wiped"])
            inactive = volume.inactive
            if entry["inactive"] is None:
                assert inactive is None
            else:
                assert inactive is not None
                assert format_table(inactive, show_keys=True) == expected_text(
                    entry["inactive"], False
                )


def run_machine(backend: str, examples: int, template: Path | str) -> None:
    class Machine(Lifecycle):
        pass

    Machine.backend = backend
    Machine.template = template
    runner = Machine.TestCase()
    runner.settings = settings(
        max_examples=examples,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    runner.runTest()


@pytest.mark.slow
def test_lifecycle_matches_the_model_across_restarts_on_sqlite(sqlite_template: Path) -> None:
    run_machine("sqlite", 100, sqlite_template)


@pytest.mark.slow
@pytest.mark.postgres
def test_lifecycle_matches_the_model_across_restarts_on_postgres(postgres_template: str) -> None:
    run_machine("postgres", 8, postgres_template)
