"""A cluster of nodes on this machine: network namespaces joined by a virtual switch.

Each node is a network namespace with one interface, ``eth0``, at 10.77.0.<n+1>, joined to the
others by a bridge; each runs its commands under its own host name (``node0``, ``node1``, ...),
which every node resolves through its ``/etc/hosts``, as on a real cluster. A link rate shapes
each node's ``eth0`` with a token bucket. The whole cluster lives in a user, network, mount and
PID namespace of its own (``unshare``): nothing on the machine changes, no privilege is
needed where the kernel allows unprivileged user namespaces, and it goes away with its last
process.

The test side calls ``run(...)``, which starts this file as the cluster's first process
(``python tests/cluster.py SPEC RESULT``): it builds the nodes, starts the commands on them
side by side, waits for them (up to a deadline, then kills them), and reports each command's
exit status, output and time, and every process left behind in the cluster once they ended.

Where the suite forks its programs from a zygote (tests/zygote.py), each node gets a zygote of
its own, started in the node's namespaces, so that what is forked from it lives on that node: a
command whose interpreter is this Python runs the node's zygote client instead, and so do the
interpreters it starts (torchrun's ranks). The zygotes end before the cluster is searched for
processes left behind.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SUBNET = "10.77.0"
INTERFACE = "eth0"
_NAMESPACES = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--propagation", "private",
               "--pid", "--fork", "--mount-proc"]


def node_name(index: int) -> str:
    return f"node{index}"


def node_address(index: int) -> str:
    return f"{SUBNET}.{index + 1}"


def on_node(index: int, argv: Sequence[str]) -> List[str]:
    """``argv`` run on node ``index``: in its network namespace, under its host name."""
    name = node_name(index)
    return ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
            name, *argv]


@dataclasses.dataclass
class Command:
    node: int
    argv: List[str]
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    cwd: Optional[str] = None


@dataclasses.dataclass
class Outcome:
    returncode: Optional[int]          # None: killed at the deadline
    stdout: str
    stderr: str
    seconds: float


@dataclasses.dataclass
class ClusterRun:
    outcomes: List[Outcome]
    left_behind: List[str]             # processes alive in the cluster after its commands ended

    @property
    def returncodes(self):
        return [outcome.returncode for outcome in self.outcomes]

    def output(self, limit=3000) -> str:
        return "\n".join(f"--- command {i} (exit {o.returncode}, {o.seconds:.0f} s)\n{o.stderr[-limit:]}"
                         for i, o in enumerate(self.outcomes))


@functools.lru_cache(maxsize=None)
def why_not() -> Optional[str]:
    """None where a cluster can be built here, else why not (the tests skip with it)."""
    for tool in ("unshare", "ip", "tc", "hostname"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = subprocess.run([*_NAMESPACES, sys.executable, __file__, "--probe"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"no cluster of network namespaces here ({(probe.stderr or probe.stdout).strip()[-300:]})"
    return None


def run(commands: Sequence[Command], *, nodes: int = 2, rate: Optional[str] = None,
        timeout: float = 240, environ: Optional[Dict[str, str]] = None, reached: Sequence[int] = ()) -> ClusterRun:
    """Run ``commands`` side by side on a fresh cluster of ``nodes``; ``rate`` (``"1gbit"``)
    shapes every node's link; each command sees ``environ`` plus its own ``env``. ``reached``:
    the nodes a command starts programs on itself (pdsh, as ssh would), which get a zygote too."""
    import zygote
    with tempfile.TemporaryDirectory(prefix="cluster-") as tmp:
        spec, result = Path(tmp, "spec.json"), Path(tmp, "result.json")
        spec.write_text(json.dumps({
            "nodes": nodes, "rate": rate, "timeout": timeout, "environ": dict(environ or os.environ),
            "commands": [dataclasses.asdict(command) for command in commands], "reached": list(reached),
            "zygotes": zygote.executable() != sys.executable}))
        driver = subprocess.run([*_NAMESPACES, sys.executable, __file__, str(spec), str(result)],
                                capture_output=True, text=True, timeout=timeout + 120)
        if driver.returncode != 0 or not result.exists():
            raise RuntimeError(f"the cluster failed (exit {driver.returncode}): {driver.stderr[-3000:]}")
        found = json.loads(result.read_text())
    return ClusterRun([Outcome(**outcome) for outcome in found["outcomes"]], found["left_behind"])


# -- inside the cluster's namespaces ----------------------------------------------------------

def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _build(nodes: int, rate: Optional[str], hosts_file: Path) -> None:
    # `ip netns` keeps its namespaces under /run/netns: a tmpfs of this mount namespace's own
    os.makedirs("/run/netns", exist_ok=True)
    _sh("mount", "-t", "tmpfs", "cluster-netns", "/run/netns")
    _sh("ip", "link", "set", "lo", "up")
    _sh("ip", "link", "add", "switch", "type", "bridge")
    _sh("ip", "link", "set", "switch", "up")
    for index in range(nodes):
        name = node_name(index)
        _sh("ip", "netns", "add", name)
        _sh("ip", "link", "add", INTERFACE, "netns", name, "type", "veth", "peer", "name", f"port{index}")
        _sh("ip", "link", "set", f"port{index}", "master", "switch", "up")
        _sh("ip", "-n", name, "addr", "add", f"{node_address(index)}/24", "dev", INTERFACE)
        _sh("ip", "-n", name, "link", "set", "lo", "up")
        _sh("ip", "-n", name, "link", "set", INTERFACE, "up")
        if rate:
            # a bucket of one millisecond at the rate, and at least two 64 KiB packets
            burst = max(int(rate.rstrip("gbit")) * 10 ** 9 // 8 // 1000, 2 * 65536)
            _sh("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", INTERFACE, "root", "tbf",
                "rate", rate, "burst", str(burst), "latency", "100ms")
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
        f"{node_address(index)} {node_name(index)}\n" for index in range(nodes)))
    _sh("mount", "--bind", str(hosts_file), "/etc/hosts")


def _processes_left(driver_pid: int) -> List[str]:
    """Processes alive in the cluster's PID namespace other than the driver (zombies the
    driver inherited are reaped first: an orphan that ended is gone on a real machine too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == driver_pid:
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        left.append(f"{entry.name} [{state}] {command}")
    return left


def _node_zygotes(spec: dict) -> dict:
    """A serving zygote per node that runs a command, started with that node's first command's
    environment (a command whose environment differs where Python or torch read it as they start
    is started afresh by it), and per node reached from one (with the first command's). Each
    zygote's folder lists every node's socket: a program started on another node with this
    node's interpreter (pdsh runs ``sys.executable`` there) forks from that node's zygote."""
    import zygote
    zygotes = {}
    for command in spec["commands"]:
        if command["node"] not in zygotes:
            zygotes[command["node"]] = zygote.Zygote({**spec["environ"], **command["env"]},
                                                     launcher=on_node(command["node"], []))
    first = spec["commands"][0]
    for node in spec["reached"]:
        if node not in zygotes:
            zygotes[node] = zygote.Zygote({**spec["environ"], **first["env"]}, launcher=on_node(node, []))
    for node, started in list(zygotes.items()):
        if not started.serving(timeout=120):
            started.stop()
            del zygotes[node]
    sockets = {node_name(node): str(started.address) for node, started in zygotes.items()}
    for started in zygotes.values():
        started.list_siblings(sockets)
    return zygotes


def _drive(spec_path: str, result_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    _build(spec["nodes"], spec["rate"], Path(spec_path).with_name("hosts"))
    zygotes = _node_zygotes(spec) if spec["zygotes"] else {}
    started, processes, outs = time.monotonic(), [], []
    for index, command in enumerate(spec["commands"]):
        out = open(Path(spec_path).with_name(f"out{index}"), "w+"), open(Path(spec_path).with_name(f"err{index}"), "w+")
        outs.append(out)
        argv = command["argv"]
        if argv[:1] == [sys.executable] and command["node"] in zygotes:
            argv = [str(zygotes[command["node"]].executable), *argv[1:]]
        processes.append(subprocess.Popen(
            on_node(command["node"], argv), env={**spec["environ"], **command["env"]},
            cwd=command["cwd"], stdout=out[0], stderr=out[1], start_new_session=True))
    ended = [None] * len(processes)
    deadline = started + spec["timeout"]
    while None in ended and time.monotonic() < deadline:
        for index, process in enumerate(processes):
            if ended[index] is None and process.poll() is not None:
                ended[index] = time.monotonic() - started
        time.sleep(0.05)
    codes = []
    for index, process in enumerate(processes):
        if ended[index] is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            codes.append(None)
            ended[index] = time.monotonic() - started
        else:
            codes.append(process.returncode)
    for node_zygote in zygotes.values():
        node_zygote.stop()
    # Whatever a command left running has had a moment to end on its own.
    settle = time.monotonic() + 5
    left = _processes_left(os.getpid())
    while left and time.monotonic() < settle:
        time.sleep(0.2)
        left = _processes_left(os.getpid())
    outcomes = []
    for code, seconds, (out, err) in zip(codes, ended, outs):
        out.seek(0), err.seek(0)
        outcomes.append({"returncode": code, "stdout": out.read(), "stderr": err.read(), "seconds": seconds})
    Path(result_path).write_text(json.dumps({"outcomes": outcomes, "left_behind": left}))


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        with tempfile.TemporaryDirectory() as tmp:
            _build(2, "1gbit", Path(tmp, "hosts"))
            named = subprocess.run(on_node(1, ["hostname"]), capture_output=True, text=True, check=True)
            assert named.stdout.strip() == node_name(1), named.stdout
    else:
        _drive(*sys.argv[1:3])
