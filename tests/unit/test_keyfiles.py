import stat
from pathlib import Path

import pytest

from app.config import Settings
from app.keyfiles import load_admin_token, load_master_key


def test_master_key_file_is_created_0600_once(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    first = load_master_key(settings)
    path = tmp_path / "master.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == 32
    assert load_master_key(settings) == first


def test_world_readable_master_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    path.write_text("00" * 32)
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="group or others"):
        load_master_key(Settings(data_dir=tmp_path))


def test_admin_token_is_generated_once_and_announced_once(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    token, created = load_admin_token(settings)
    again, created_again = load_admin_token(settings)
    assert created
    assert not created_again
    assert token == again
    assert len(token) >= 32
