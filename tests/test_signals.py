"""SIGTERM and SIGHUP end a command as Ctrl-C does: exit 128 + the signal, the folder's lock released, nothing
partial kept, and the next run works; a signal the parent told it to ignore (nohup) stays ignored. Through the
real entry point, in a child process, whatever the shell that started the tests did with signals."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, copy_export

from vitexport.artifacts.folder import LOCK_NAME

HELDOUT = ROOT / "calibration" / "digits" / "heldout"
# a bench that times for a long while once it has started: the signal arrives mid-run
LONG_BENCH = ["--data", str(HELDOUT), "--backend", "onnxruntime cpu fp32", "--batch", "1", "--iterations", "10000",
              "--min-time", "300", "--no-prepare"]


@pytest.fixture(scope="module")
def made(tmp_path_factory, digits_export):
    root = tmp_path_factory.mktemp("signals")
    copy_export(digits_export, root / "model")
    return root / "model"


def _start(folder, tmp, ignore=()):
    def preexec():
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)
        for sig in {signal.SIGTERM, signal.SIGHUP} - set(ignore):
            signal.signal(sig, signal.SIG_DFL)  # whatever the test runner's parent left

    return subprocess.Popen([sys.executable, "-m", "vitexport", "bench", str(folder), *LONG_BENCH],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=preexec,
                            env={**os.environ, "TMPDIR": str(tmp)})  # where the run's decoded inputs go


def _wait_until_timing(proc, timeout=120):
    """Until the bench is on its first row (the lock held, the inputs decoded), then into its timing loop."""
    lines, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "pytorch cpu fp32 ..." in line:
            time.sleep(3.0)  # its parity pass over 360 digits, then its timing loop
            return lines
    proc.kill()
    raise AssertionError("the bench never reached its first row:\n" + "".join(lines))


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if ".vx" in p.name and p.name != LOCK_NAME]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_run_like_ctrl_c(made, tmp_path, sig):
    folder = tmp_path / "m"
    shutil.copytree(made, folder, ignore=shutil.ignore_patterns(LOCK_NAME))
    proc = _start(folder, tmp_path)
    _wait_until_timing(proc)
    assert list(tmp_path.glob(".vitexport-inputs-*"))  # the decoded inputs, while it runs
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, (proc.returncode, err[-2000:])
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last == f"Error: Stopped by {signal.Signals(sig).name}; no partial output was kept.", err[-2000:]
    assert "Traceback" not in err
    assert not _leftovers(folder) and not list(tmp_path.glob(".vitexport-inputs-*"))
    # the lock was released: the next writer gets it at once
    r = subprocess.run([sys.executable, "-m", "vitexport", "--lock-timeout", "0", "quantize", str(folder), "--fp16",
                        "--no-check", "-q"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr


def test_an_inherited_ignore_is_kept(made, tmp_path):
    """nohup: SIGHUP ignored by the parent stays ignored; SIGTERM still stops the run."""
    folder = tmp_path / "m"
    shutil.copytree(made, folder, ignore=shutil.ignore_patterns(LOCK_NAME))
    proc = _start(folder, tmp_path, ignore=(signal.SIGHUP,))
    _wait_until_timing(proc)
    proc.send_signal(signal.SIGHUP)
    time.sleep(2.0)
    assert proc.poll() is None  # still running
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
