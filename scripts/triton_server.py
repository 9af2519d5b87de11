"""A real Triton Inference Server on this machine, without docker: the `tritonserver` binary that the
`nvidia-pytriton` wheel ships, with its python backend, serving a repository written by `vitexport triton`.

    python scripts/triton_server.py prepare              # the server's venv (numpy<2, onnxruntime, the wheel)
    python scripts/triton_server.py serve REPO           # python-backend every entry of REPO, then serve it

No pip package ships Triton's onnxruntime backend, so each entry's `platform: "onnxruntime_onnx"` becomes
`backend: "python"` with a model.py that runs ONNX Runtime on the same model.onnx (`python_backend`). What the
server needs, found by trial on manylinux_2_35 wheels (nvidia-pytriton 0.7.0, tritonserver 2.51):

- its own environment with numpy<2: with numpy 2 every inference fails ("output tensor shape does not match size");
- LD_LIBRARY_PATH holding the wheel's `nvidia_pytriton.libs` and the venv Python's LIBDIR (libpython);
- the python backend's stub for the venv's Python version next to `libtriton_python.so`;
- the venv's bin/ first on PATH: the stub's embedded Python finds its prefix (and so numpy) from `python3` there.

The tests (tests/triton_fixture.py) start the server through `start()` on free ports of 127.0.0.1 and stop it by
its process id; `.ci/run` runs `prepare` first, so the suite does not spend its time on the install.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = Path(os.environ.get("VITEXPORT_TRITON_VENV", ROOT / ".triton-venv"))
REQUIREMENTS = ["numpy<2", "onnxruntime>=1.17", "nvidia-pytriton==0.7.0"]
READY_MARK = ".vitexport-ready"  # written last by prepare(): a venv without it is half-made

MODEL_PY = '''"""Triton python backend: ONNX Runtime on this version's model.onnx (written by scripts/triton_server.py)."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(os.path.join(folder, "model.onnx"), options,
                                            providers=["CPUExecutionProvider"])
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        self.batched = config.get("max_batch_size", 0) > 0

    def execute(self, requests):
        """The requests the dynamic batcher gathered, run as one batch and split again."""
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        if self.batched and len(feeds) > 1:
            sizes = [len(f[self.inputs[0]]) for f in feeds]
            outs = self.session.run(self.outputs, {n: np.concatenate([f[n] for f in feeds]) for n in self.inputs})
            ends = np.cumsum(sizes)
            per_request = [[o[e - s:e] for o in outs] for s, e in zip(sizes, ends)]
        else:
            per_request = [self.session.run(self.outputs, f) for f in feeds]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(n, np.ascontiguousarray(o))
                                            for n, o in zip(self.outputs, outs)]) for outs in per_request]
'''


# -- the environment ---------------------------------------------------------------------------------------------

def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def runnable_here() -> str | None:
    """Why the wheel cannot run on this machine, or None: it is built for x86_64 Linux with glibc 2.35 or newer."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"the nvidia-pytriton wheel is built for x86_64 Linux, not {sys.platform} {platform.machine()}"
    libc, version = platform.libc_ver()
    if libc == "glibc" and tuple(map(int, version.split(".")[:2])) < (2, 35):
        return f"the nvidia-pytriton wheel needs glibc 2.35 or newer; this machine has {version}"
    return None


def prepare(venv: Path = DEFAULT_VENV, quiet: bool = False) -> Path:
    """The server's venv, made once (READY_MARK says it is whole): numpy<2, onnxruntime, nvidia-pytriton, and the
    python backend's stub for the venv's Python put next to libtriton_python.so."""
    if (venv / READY_MARK).is_file():
        return venv
    if why := runnable_here():
        raise SystemExit(why)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv_python(venv)), "-m", "pip", "install", *(["-q"] if quiet else []),
                    "--disable-pip-version-check", *REQUIREMENTS], check=True)
    server = site_packages(venv) / "pytriton" / "tritonserver"
    version = subprocess.run([str(venv_python(venv)), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                             check=True, capture_output=True, text=True).stdout.strip()
    shutil.copy(server / "python_backend_stubs" / version / "triton_python_backend_stub",
                server / "backends" / "python" / "triton_python_backend_stub")
    (venv / READY_MARK).write_text(json.dumps({"requirements": REQUIREMENTS, "python": version}) + "\n")
    return venv


def server_env(venv: Path) -> dict[str, str]:
    """The server process's environment (see the module's docstring)."""
    libdir = subprocess.run([str(venv_python(venv)), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                            check=True, capture_output=True, text=True).stdout.strip()
    libs = [str(site_packages(venv) / "nvidia_pytriton.libs"), libdir]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["LD_LIBRARY_PATH"] = ":".join(libs + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


# -- the repository ----------------------------------------------------------------------------------------------

def python_backend(entry: Path) -> None:
    """A `vitexport triton` entry (REPO/NAME, an ONNX one) served by the python backend instead of onnxruntime_onnx."""
    config = entry / "config.pbtxt"
    text = config.read_text()
    if 'backend: "python"' not in text:
        text, n = re.subn(r'^platform: "onnxruntime_onnx"$', 'backend: "python"', text, flags=re.M)
        if n != 1:
            raise SystemExit(f"{config} is not an onnxruntime_onnx entry")
        config.write_text(text)
    for version in (p for p in entry.iterdir() if p.is_dir() and p.name.isdigit()):
        (version / "model.py").write_text(MODEL_PY)


# -- the server --------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    log: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http}/v2/health/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """By its process id: SIGTERM to its process group, then SIGKILL after 10 s. The group holds the python
        backend's stubs too, which outlive a server that died (they are not told), so it is signalled even then."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break  # nothing left in the group
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(self.process.pid):
                break
            time.sleep(0.2)  # the stubs are told by the server's exit; give them a moment before SIGKILL


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies, which only wait for a reaper, do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def start(repo: Path, venv: Path = DEFAULT_VENV, log: Path | None = None, timeout: float = 120.0) -> Server:
    """tritonserver on free ports of 127.0.0.1 serving `repo`, once every model in it is ready."""
    server = site_packages(venv) / "pytriton" / "tritonserver"
    http_port, grpc_port = free_port(), free_port()
    log = log or repo.parent / f"tritonserver-{http_port}.log"
    cmd = [str(server / "bin" / "tritonserver"), f"--model-repository={repo}",
           f"--backend-directory={server / 'backends'}", f"--cache-directory={server / 'caches'}",
           f"--http-port={http_port}", f"--grpc-port={grpc_port}", "--http-address=127.0.0.1",
           "--grpc-address=127.0.0.1", "--allow-metrics=false", "--exit-on-error=true",
           "--strict-readiness=true"]
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=server_env(venv),
                                   start_new_session=True)
    s = Server(process, http_port, grpc_port, log)
    deadline = time.monotonic() + timeout
    while not s.ready():
        if process.poll() is not None or time.monotonic() > deadline:
            s.stop()
            raise RuntimeError(f"tritonserver did not become ready (exit {process.poll()}); its log:\n"
                               + log.read_text(errors="replace")[-4000:])
        time.sleep(0.2)
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="make the server's venv (once)")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p = sub.add_parser("serve", help="serve a repository written by `vitexport triton` until Ctrl-C")
    p.add_argument("repo", type=Path)
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args()
    if args.command == "prepare":
        print(f"Triton's venv: {prepare(args.venv)}")
        return
    for entry in (e for e in args.repo.iterdir() if (e / "config.pbtxt").is_file()):
        python_backend(entry)
    s = start(args.repo.resolve(), prepare(args.venv))
    print(f"serving {args.repo} at {s.http} and {s.grpc} (pid {s.process.pid}, log {s.log}); Ctrl-C stops it")
    try:
        s.process.wait()
    except KeyboardInterrupt:
        s.stop()


if __name__ == "__main__":
    main()
