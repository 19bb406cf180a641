"""`make test` sets up what its tests need, in one place: scripts/test-prerequisites.sh.

No network and no apt here: the script runs with a PATH of stand-ins (`id`,
`sudo`, `apt-get`) that log how they were called, and no browser on it.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "test-prerequisites.sh"
STEP = "scripts/test-prerequisites.sh"


def make_dry_run(target):
    """The commands `make TARGET` would run, the venv's install left out (-o: taken as up to date)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    result = subprocess.run(
        [make, "-n", "-o", ".venv/.installed-stamp", target], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("target", ["test", "test-fast"])
def test_the_make_targets_set_up_the_prerequisites_before_any_test(target):
    lines = make_dry_run(target)
    steps = [number for number, line in enumerate(lines) if STEP in line]
    pytests = [number for number, line in enumerate(lines) if "-m pytest" in line]
    assert len(steps) == 1 and pytests, lines
    assert steps[0] < pytests[0], lines
    if target == "test":  # both parts, the JAX part too
        assert any("KERAS_BACKEND=jax" in line for line in lines[pytests[0]:]), lines


def test_ci_runs_make_test_and_installs_nothing_itself():
    commands = [
        line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert commands[-1] == "make test", commands
    assert not any(re.search(r"apt|chromium|pip install", command) for command in commands), commands
    makefile = (ROOT / "Makefile").read_text()
    assert "apt-get" not in makefile and "sudo" not in makefile  # only the script installs


def stand_ins(directory, uid, sudo_works):
    """A directory for PATH: `id -u` prints UID, `sudo` succeeds or asks for a password, `apt-get` "installs"
    by writing a `chromium`; each logs its arguments to calls.log. `env` and `sh` are the real ones."""
    directory.mkdir()
    log = directory / "calls.log"
    scripts = {
        "id": f'echo "id $*" >> {log}; echo {uid}',
        "sudo": f'echo "sudo $*" >> {log}; ' + ('[ "$1" = -n ] && [ "$2" = true ] && exit 0; exec "$@"' if sudo_works else "exit 1"),
        "apt-get": f'echo "apt-get $*" >> {log}; '
        f'case "$*" in *install*) printf "#!/bin/sh\\n" > {directory}/chromium; {shutil.which("chmod")} +x {directory}/chromium;; esac',
    }
    for name, body in scripts.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    for name in ("env", "sh"):
        (directory / name).symlink_to(shutil.which(name))
    return log


def run_script(directory):
    environment = {key: value for key, value in os.environ.items() if key not in ("PATH", "SUDO_USER")}
    environment["PATH"] = str(directory)
    return subprocess.run(
        [shutil.which("sh"), str(SCRIPT)], capture_output=True, text=True, env=environment, timeout=60
    )


def calls(log):
    return log.read_text().splitlines() if log.exists() else []


def test_without_chromium_root_or_sudo_it_names_the_command_and_stops(tmp_path):
    log = stand_ins(tmp_path / "bin", uid=1000, sudo_works=False)
    result = run_script(tmp_path / "bin")
    assert result.returncode != 0
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert "chromium" in result.stderr and "sudo apt-get install chromium" in result.stderr
    # It asked who it is and whether sudo needs a password, and ran nothing else.
    assert calls(log) == ["id -u", "sudo -n true"]


def test_as_root_it_installs_chromium_with_apt(tmp_path):
    log = stand_ins(tmp_path / "bin", uid=0, sudo_works=False)
    result = run_script(tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    assert calls(log) == ["id -u", "apt-get update -q", "apt-get install -y -q chromium"]
    assert (tmp_path / "bin" / "chromium").exists()


def test_with_sudo_that_needs_no_password_it_installs_through_sudo(tmp_path):
    log = stand_ins(tmp_path / "bin", uid=1000, sudo_works=True)
    result = run_script(tmp_path / "bin")
    assert result.returncode == 0, result.stderr
    assert calls(log) == [
        "id -u", "sudo -n true", "sudo apt-get update -q", "apt-get update -q",
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium", "apt-get install -y -q chromium",
    ]


def test_with_chromium_present_it_does_nothing(tmp_path):
    log = stand_ins(tmp_path / "bin", uid=1000, sudo_works=False)
    (tmp_path / "bin" / "chromium").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "chromium").chmod(0o755)
    result = run_script(tmp_path / "bin")
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert calls(log) == []
