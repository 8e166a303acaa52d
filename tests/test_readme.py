"""README.md is the front door (issue 27): short, every command in it runs here, its output is
the programs' own, its links resolve.

Its ``bash`` blocks are the two set-up commands (the second is what ``.ci/run`` does; the first
installs a subset of it and ends with ``trtrepo deploy``) and the main journey on the demo
(``deploy``, ``serve``, ``validate``), which :func:`test_the_main_journey_runs_as_written` runs
through bash in a temporary folder against the real tritonserver. A new ``bash`` block fails
:func:`test_every_command_block_is_run_here` until a test runs it."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 170

# What the journey test adds to the README's commands, and nothing else: free ports instead of
# 8000-8002 (other servers may hold those), and shorter measurement windows to stay near a minute.
FAST_VALIDATE = ("--requests", "50", "--max-trials", "3", "--speed-batch-sizes", "1", "--speed-iterations", "4",
                 "--speed-warmup", "1")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)


def _commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def _readme() -> str:
    return README.read_text()


def _setup_blocks() -> list[str]:
    return [b for b in _blocks(_readme(), "bash") if b.startswith("python3 -m venv")]


def _journey_blocks() -> list[str]:
    return [b for b in _blocks(_readme(), "bash") if b.startswith("trtrepo ")]


def test_the_readme_is_short():
    lines = _readme().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; the front door stays <= {MAX_LINES} (move detail to docs/)"


def test_every_command_block_is_run_here():
    bash = _blocks(_readme(), "bash")
    assert len(_setup_blocks()) == 2
    assert [_commands(b)[0].split()[:2] for b in _journey_blocks()] == [["trtrepo", "deploy"], ["trtrepo", "serve"],
                                                                       ["trtrepo", "validate"]]
    others = [b for b in bash if b not in _setup_blocks() + _journey_blocks()]
    assert not others, f"README bash blocks no test runs (add them to tests/test_readme.py): {others}"


def _steps(command: str) -> list[str]:
    """A set-up line's steps, normalised as .ci/run spells them (python -m pip, -q)."""
    out = []
    for step in command.split(" && "):
        words = [w for w in shlex.split(step) if w != "-q"]
        if words[:1] == ["pip"]:
            words = ["python", "-m", *words]
        out.append(" ".join(words))
    return out


def test_the_set_up_commands_are_what_ci_runs():
    """The second set-up command is .ci/run's install and test command, step for step (the test
    command line is what CI runs); the first is a subset of it that ends with `trtrepo deploy`."""
    first, second = (_commands(b) for b in _setup_blocks())
    assert len(first) == 1 and len(second) == 1
    ci = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and not line.startswith(("if ", "fi", "then", "else", "set ", "cd ")):
            ci.append(" ".join(w for w in shlex.split(line) if w != "-q"))
    steps = _steps(second[0])
    assert steps[-1] == "python -m pytest -n logical" and steps[-1] in ci
    for step in steps:
        assert step in ci, f"README's test set-up step {step!r} is not in .ci/run"
    assert ci.index(steps[0]) < ci.index(steps[-1])
    *install, last = _steps(first[0])
    assert last == "trtrepo deploy"
    assert [s for s in install if s not in steps] == ["python -m pip install -e ."]  # the test extra aside
    for script in re.findall(r"bash (scripts/\S+)", first[0] + second[0]):
        assert (ROOT / script).is_file(), script


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.S | re.M)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", ["README.md", "docs/cli.md", "docs/quantization.md", "docs/serving.md",
                                  "docs/fleet.md", "docs/benchmarks.md"])
def test_links_resolve(page):
    """Relative links of the README and the docs it sends readers to: the file exists, and the
    #anchor is one of its headings."""
    path = ROOT / page
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.S | re.M)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links or page == "docs/benchmarks.md"
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        dest = (path.parent / target).resolve() if target else path
        assert dest.exists(), f"{page}: link {link} -> {dest} does not exist"
        if anchor:
            assert anchor in _anchors(dest), f"{page}: link {link}: no heading with anchor #{anchor} in {target or page}"


def _output_blocks() -> list[str]:
    return _blocks(_readme(), "text")


def _prefix(line: str) -> str:
    """What a shown output line must start like: up to its first digit, path or elision."""
    return re.split(r"[0-9]|/tmp/|\.\.\.", line, maxsplit=1)[0]


def _ports_below_the_ephemeral_range(n: int) -> list[int]:
    """n free ports below the kernel's ephemeral range. The journey binds its ports only after its
    deploy (15-30 s); a port taken from the ephemeral range (``free_ports``) can be handed out to
    another worker's server in that time, and once was (``serve`` then refused it: exit 2). The
    other tests' servers take ephemeral ports, so ports below the range do not meet them."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(20000, max(20001, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


@pytest.mark.slow
@pytest.mark.triton
def test_the_main_journey_runs_as_written(tmp_path):
    """deploy, serve in the background, validate, kill: the README's blocks through bash in an
    empty folder, against the real tritonserver; the output shown in the README is the shape of
    what they print (each shown line's opening words appear), and validate passes."""
    from trtrepo.server import find_server_binary

    if find_server_binary(None) is None:
        pytest.skip("tritonserver not installed (run scripts/install_tritonserver.sh)")
    http, grpc, metrics = _ports_below_the_ephemeral_range(3)
    script = ["set -e"]
    for block in _journey_blocks():
        for command in _commands(block):
            if command.startswith("trtrepo serve "):
                assert command.endswith(" &"), command
                command = command[:-2] + f" --http-port {http} --grpc-port {grpc} --metrics-port {metrics} &"
            elif command.startswith("trtrepo validate "):
                assert "--url 127.0.0.1:8001 " in command, command
                command = command.replace("127.0.0.1:8001", f"127.0.0.1:{grpc}") + " " + " ".join(FAST_VALIDATE)
            script.append(command)
    script.append("wait")  # for `trtrepo serve` to stop its server after `kill %1`
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    took = time.monotonic() - start
    assert proc.returncode == 0, out[-6000:]
    assert (tmp_path / "model_repository" / "demo" / "config.pbtxt").is_file()
    assert {p.name for p in (tmp_path / "validate-report").iterdir()} >= {"validate.json", "validate.md"}
    assert "validation failed" not in out and "contract ok" in out and "tritonserver ready" in out, out[-6000:]
    real = [_prefix(line) for line in out.splitlines()]
    for block in _output_blocks():
        for line in block.splitlines():
            if line.strip() in ("", "...") or "warning:" in line:
                continue
            shown = _prefix(line)
            assert any(r.startswith(shown) for r in real), f"README shows {line!r}, the commands print no such line:\n{out}"
    print(f"README journey took {took:.0f}s")
