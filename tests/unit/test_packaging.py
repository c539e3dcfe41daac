"""The build and the setup script stay quiet: a person sees only what needs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reading_the_build_configuration_raises_no_warning(tmp_path: Path) -> None:
    """Experimental pyproject tables warn on every build; setup.py states those parts."""
    result = subprocess.run(
        [sys.executable, "-W", "error", str(ROOT / "setup.py"), "--name"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "reqcrypt"


def test_setup_prints_nothing_when_everything_is_installed() -> None:
    result = subprocess.run(
        [str(ROOT / "scripts" / "setup")], capture_output=True, text=True, check=True
    )
    assert result.stdout + result.stderr == ""
