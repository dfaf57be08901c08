"""scripts/setup.sh waits for another apt's lock (bounded) and cleans up what it wrote.

The script runs for real with a fake apt-get (and a fake `id` saying root) first on its
PATH: the fake fails `update` on the package lists' lock as many times as asked, and its
`install` notes the policy-rc.d it finds, then fails as a broken mirror would. The script
never gets past the packages here, so the venv is never touched. POLICY_RC_D points the
script's policy-rc.d into the test's folder.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

FAKE_APT = """#!/bin/bash
echo "$*" >> "$FAKE_DIR/calls"
case " $* " in
  *" update "*)
    n=$(cat "$FAKE_DIR/locked" 2>/dev/null || echo 0)
    if [ "$n" != 0 ]; then
        [ "$n" = forever ] || echo $((n - 1)) > "$FAKE_DIR/locked"
        echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)" >&2
        exit 100
    fi ;;
  *" install "*)
    cat "$POLICY_RC_D" > "$FAKE_DIR/policy-at-install" 2>/dev/null
    echo "E: Unable to locate package chromium" >&2
    exit 100 ;;
esac
"""
# What the script needs from the system besides bash's builtins.
TOOLS = ("dirname", "cat", "sha256sum", "cut", "chmod", "rm", "cp", "mv", "mktemp", "sleep")


def _setup(tmp_path: Path, *, locked: str, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(FAKE_APT)
    (fake / "id").write_text("#!/bin/sh\necho 0\n")
    for name in ("apt-get", "id"):
        (fake / name).chmod(0o755)
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed")
        (fake / tool).symlink_to(found)
    (tmp_path / "locked").write_text(locked)
    bash = shutil.which("bash")
    assert bash is not None
    env = {"PATH": str(fake), "FAKE_DIR": str(tmp_path), "HOME": str(tmp_path),
           "POLICY_RC_D": str(tmp_path / "policy-rc.d"), **env}  # fmt: skip
    # `test`: chromium and curl are never on this PATH, so there is always something to get.
    argv = [bash, str(ROOT / "scripts" / "setup.sh"), "test"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_update_waits_for_the_lock_and_a_failed_install_leaves_no_policy(tmp_path) -> None:
    done = _setup(tmp_path, locked="2")
    assert done.returncode != 0 and "Unable to locate package" in done.stderr, done
    calls = _calls(tmp_path)
    assert [c.split()[-2:] for c in calls[:3]] == [["update", "-qq"]] * 3, calls
    assert "install" in calls[3] and len(calls) == 4, calls
    assert all(c.startswith("-o DPkg::Lock::Timeout=300 ") for c in calls), calls
    assert "waiting up to 300 s" in done.stdout
    # Services were denied during the install, and the file is gone after it failed.
    assert (tmp_path / "policy-at-install").read_text() == "#!/bin/sh\nexit 101\n"
    assert not (tmp_path / "policy-rc.d").exists()


def test_the_machines_own_policy_is_put_back(tmp_path) -> None:
    own = tmp_path / "policy-rc.d"
    own.write_text("#!/bin/sh\n# the admin's\nexit 0\n")
    own.chmod(0o750)
    done = _setup(tmp_path, locked="0")
    assert done.returncode != 0, done
    assert (tmp_path / "policy-at-install").read_text() == "#!/bin/sh\nexit 101\n"
    assert own.read_text() == "#!/bin/sh\n# the admin's\nexit 0\n"
    assert own.stat().st_mode & 0o777 == 0o750


def test_a_lock_held_past_the_bound_fails_with_apts_message(tmp_path) -> None:
    started = time.monotonic()
    done = _setup(tmp_path, locked="forever", APT_LOCK_WAIT_S="3")
    assert done.returncode != 0 and "Could not get lock" in done.stderr, done
    assert 3 <= time.monotonic() - started < 60
    assert not [c for c in _calls(tmp_path) if "install" in c]
    assert not (tmp_path / "policy-rc.d").exists()
