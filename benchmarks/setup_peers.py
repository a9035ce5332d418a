"""Make each peer's virtual environment (build/peers/<peer>/venv) from its runner's ENV.

    .venv/bin/python benchmarks/setup_peers.py              # every peer; up-to-date ones are kept
    .venv/bin/python benchmarks/setup_peers.py dali_cpu tfdata  # some
    .venv/bin/python benchmarks/setup_peers.py --force ffcv_beton  # remake

A runner (benchmarks/peer_runners/<peer>.py) declares ENV, a dict literal read here without
importing the module (see _common.py); ENV = {"venv": "<other runner>"} runs it in that runner's
venv (the same library, measured by another benchmark). Each peer gets its own venv so that its
pins (numpy, Pillow-SIMD replacing Pillow, TensorFlow's protobuf) cannot disturb another's. The
outcome is written to build/peers/<peer>/status.json: {"ok", "error", "seconds", "env"}; a peer
that cannot be installed is reported by benchmarks/run.py with that error, never silently
dropped. The full log is build/peers/<peer>/setup.log.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ROOT / "benchmarks" / "peer_runners"
PEERS = ROOT / "build" / "peers"
TORCH = "torch==2.13.0"  # the CPU build from the machine's local file: never a CUDA download


def runners() -> dict[str, Path]:
    return {p.stem: p for p in sorted(RUNNERS.glob("*.py")) if not p.stem.startswith("_")}


def read_env(runner: Path) -> dict:
    """The runner's ENV = {...}, evaluated as a literal."""
    for node in ast.parse(runner.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "ENV" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise SystemExit(f"{runner}: no ENV = {{...}} literal")


def venv_owner(name: str) -> str:
    """The runner whose venv runs `name`: the one its ENV's "venv" names, else itself."""
    owner = read_env(runners()[name]).get("venv")
    return owner if owner and owner != "main" else name


def python_of(name: str) -> Path:
    """The interpreter that runs this peer's runner."""
    env = read_env(runners()[name])
    if env.get("venv") == "main":
        return Path(sys.executable)
    return PEERS / venv_owner(name) / "venv" / "bin" / "python"


def status(name: str) -> dict:
    if venv_owner(name) != name:
        return status(venv_owner(name))
    env = read_env(runners()[name])
    if env.get("venv") == "main":
        return {"ok": True, "env": env}
    path = PEERS / name / "status.json"
    if not path.exists():
        return {"ok": False, "error": "not set up: run make bench-peers-setup", "env": env}
    return json.loads(path.read_text())


def _run(cmd: str, log, env: dict[str, str], cwd: Path) -> None:
    log.write(f"\n$ {cmd}\n")
    log.flush()
    result = subprocess.run(
        cmd, shell=True, executable="/bin/bash", stdout=log, stderr=subprocess.STDOUT, env=env,
        cwd=cwd,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"`{cmd}` exited with {result.returncode}")


def _tail(path: Path, lines: int = 12) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def setup(name: str, force: bool = False) -> dict:
    if venv_owner(name) != name:
        return setup(venv_owner(name), force)
    env = read_env(runners()[name])
    if env.get("venv") == "main":
        return {"ok": True, "env": env}
    folder = PEERS / name
    state = folder / "status.json"
    if not force and state.exists():
        previous = json.loads(state.read_text())
        if previous.get("ok") and previous.get("env") == env:
            print(f"{name}: up to date")
            return previous
    venv = folder / "venv"
    build = folder / "build"
    shutil.rmtree(venv, ignore_errors=True)
    build.mkdir(parents=True, exist_ok=True)
    log_path = folder / "setup.log"
    t0 = time.time()
    print(f"{name}: setting up (log: {log_path.relative_to(ROOT)})", flush=True)
    shell_env = dict(os.environ, VENV=str(venv), PY=str(venv / "bin" / "python"), BUILD=str(build))
    shell_env.pop("PYTHONPATH", None)
    pip = f"{venv}/bin/python -m pip install -q --disable-pip-version-check"
    outcome: dict = {"env": env}
    with open(log_path, "w") as log:
        try:
            if env.get("apt"):
                sudo = "" if os.geteuid() == 0 else "sudo "
                missing = [
                    p for p in env["apt"]
                    if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0
                ]  # fmt: skip
                if missing:
                    install = f"DEBIAN_FRONTEND=noninteractive {sudo}apt-get install -y -qq"
                    cmd = f"{sudo}apt-get update -qq && {install} {' '.join(missing)}"
                    _run(cmd, log, shell_env, build)
            _run(f"{sys.executable} -m venv {venv}", log, shell_env, build)
            _run(f"{pip} --upgrade pip", log, shell_env, build)
            if env.get("torch"):
                _run(f"{pip} {TORCH}", log, shell_env, build)
            if env.get("pip"):
                _run(f"{pip} " + " ".join(f"'{p}'" for p in env["pip"]), log, shell_env, build)
            for cmd in env.get("build", []):
                _run(cmd, log, shell_env, build)
            _run(f"{venv}/bin/python -m pip freeze", log, shell_env, build)
            outcome.update(ok=True)
        except Exception as e:  # recorded for the report, which says the peer did not install
            outcome.update(ok=False, error=f"{e}\n{_tail(log_path)}")
    outcome["seconds"] = round(time.time() - t0, 1)
    state.write_text(json.dumps(outcome, indent=1))
    print(f"{name}: {'ok' if outcome['ok'] else 'FAILED: ' + outcome['error']}", flush=True)
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peers", nargs="*", help="runner names (default: all)")
    parser.add_argument("--force", action="store_true", help="remake even if up to date")
    args = parser.parse_args()
    names = args.peers or list(runners())
    unknown = set(names) - set(runners())
    if unknown:
        raise SystemExit(f"no runner for {sorted(unknown)}; runners: {sorted(runners())}")
    for name in dict.fromkeys(venv_owner(n) for n in names):  # a shared venv once
        setup(name, args.force)
    return 0  # a peer that failed is reported, not fatal: the others still run


if __name__ == "__main__":
    sys.exit(main())
