#!/usr/bin/env python3
"""Several machines on one: K nodes, each a network namespace with one address and its own host
name, joined by veth pairs to a bridge that lives in a namespace of its own, so nothing touches
this machine's interfaces and no packet leaves the namespaces. Needs root.

By hand::

    python .ci/nodes.py up 2 [--cap 100]   # node0 198.18.0.1, node1 198.18.0.2, 100 Mbit/s links
    python .ci/nodes.py exec node0 -- hostname -I
    python .ci/nodes.py cut node1 / mend node1 / cap 1000 / cap 0
    python .ci/nodes.py down [--all]       # removes that set (--all: every psnode-* namespace)

From tests: ``Nodes.up(2, cap_mbit=100)``, then ``nodes.popen(0, argv)`` and ``nodes.down()``
(tests/conftest.py's ``multinode`` fixture tears down even when the test fails).

Addresses come from 198.18.0.0/15, the block reserved for network benchmarking (RFC 2544); every
set of nodes has its own bridge namespace, so two sets reuse them without meeting. A node's host
name resolves to its address through ``/etc/netns/<namespace>/hosts``, mounted over /etc/hosts
for what runs in the node (as ``ip netns exec`` would): what a cluster's DNS does, and what
gloo needs to find the interface to listen on. A bandwidth cap is a token bucket
(``tc ... tbf``) on both ends of each node's link, one per direction (this kernel has no netem;
tbf and htb are there).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREFIX = "psnode-"  # every namespace this tool makes is named PREFIX + tag + "-" + what
HAND_TAG = "hand"  # the set made from the command line
NETNS_ETC = Path("/etc/netns")
SUBNET = "198.18.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why nodes cannot be made here (None when they can): root, ip, unshare and a namespace
    that can really be added."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nsenter", "unshare", "tc", "ss", "hostname"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot add a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Node:
    index: int
    host: str  # its host name: node0, node1...
    netns: str  # its namespace
    address: str
    link: str  # its veth's name in the bridge namespace


class Nodes:
    """A set of nodes with one tag; ``down`` removes all of it, processes included."""

    def __init__(self, tag: str, count: int):
        self.tag = tag
        self.bridge = f"{PREFIX}{tag}-br"
        self.nodes = [Node(i, f"node{i}", f"{PREFIX}{tag}-{i}", f"{SUBNET}.{i + 1}", f"v{i}")
                      for i in range(count)]

    @classmethod
    def up(cls, count: int, cap_mbit: float = 0, tag: str | None = None) -> Nodes:
        nodes = cls(tag or secrets.token_hex(3), count)
        try:
            nodes._make()
            if cap_mbit:
                nodes.cap(cap_mbit)
        except BaseException:
            nodes.down()
            raise
        return nodes

    def _make(self) -> None:
        br = self.bridge
        _ip("netns", "add", br)
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.host}\n" for n in self.nodes)
        for n in self.nodes:
            _ip("netns", "add", n.netns)
            # made inside the bridge's namespace, the pair never appears among the host's links
            _ip("-n", br, "link", "add", n.link, "type", "veth", "peer", "name", "eth0",
                "netns", n.netns)
            _ip("-n", br, "link", "set", n.link, "master", "br0", "up")
            _ip("-n", n.netns, "addr", "add", f"{n.address}/24", "dev", "eth0")
            _ip("-n", n.netns, "link", "set", "eth0", "up")
            _ip("-n", n.netns, "link", "set", "lo", "up")
            (NETNS_ETC / n.netns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / n.netns / "hosts").write_text(hosts)

    def node(self, which: int | str) -> Node:
        for n in self.nodes:
            if which in (n.index, n.host, n.netns):
                return n
        raise KeyError(f"no node {which!r} in set {self.tag}")

    def command(self, which: int | str, argv: list[str]) -> list[str]:
        """``argv`` run inside the node: its network, its /etc/hosts, its host name."""
        n = self.node(which)
        # nsenter keeps this machine's /sys (``ip netns exec`` mounts a new one, without the
        # cgroup hierarchies slurmd needs); a private mount namespace takes the node's hosts
        return ["nsenter", f"--net=/run/netns/{n.netns}", "unshare", "--mount", "--uts",
                "--propagation", "private", "sh", "-c",
                'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"',
                n.host, str(NETNS_ETC / n.netns / "hosts"), *argv]

    def popen(self, which: int | str, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(which, argv), **kwargs)

    def run(self, which: int | str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(which, argv), **kwargs)

    def cut(self, which: int | str) -> None:
        """Pull the node's cable: its link goes down at the bridge."""
        _ip("-n", self.bridge, "link", "set", self.node(which).link, "down")

    def mend(self, which: int | str) -> None:
        _ip("-n", self.bridge, "link", "set", self.node(which).link, "up")

    def cap(self, mbit: float) -> None:
        """Every link at ``mbit`` Mbit/s each way (0: uncapped). The bucket holds at least
        256 KiB: veth hands over 64 KiB segments, and tbf drops a packet larger than its
        bucket."""
        burst = max(256 * 1024, int(mbit * 1e6 / 8 / 100))  # 10 ms at the rate
        for n in self.nodes:
            for ns, dev in ((n.netns, "eth0"), (self.bridge, n.link)):
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)
                if mbit:
                    subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                                    "rate", f"{mbit}mbit", "burst", str(burst),
                                    "latency", "100ms"], check=True, capture_output=True)

    def listening(self, which: int | str) -> list[tuple[str, str]]:
        """(local address:port, process) of every TCP socket listening inside the node."""
        out = subprocess.run(["ip", "netns", "exec", self.node(which).netns,
                              "ss", "-ltnpH"], check=True, capture_output=True, text=True)
        found = []
        for line in out.stdout.splitlines():
            fields = line.split()
            found.append((fields[3], " ".join(fields[5:])))
        return found

    def slurm(self, folder: Path) -> dict[str, str]:
        """A Slurm cluster of its own: slurmctld on the last node, one slurmd on each other
        (found by its host name, as on a cluster), state and logs in ``folder``, the spool in a
        short folder of its own. Uses this machine's munged (its socket is a file, which every node sees). Returns the
        variables a command needs to use it (run it inside a node: the controller's address
        is the node's)."""
        folder.mkdir(parents=True, exist_ok=True)
        *workers, head = self.nodes
        cpus = os.cpu_count() or 1
        # slurmstepd's sockets live in the spool folder and a socket path has at most 108
        # bytes: a test's tmp_path under xdist is too deep, so the spool gets a short path
        spool = self.spool()
        for n in workers:
            (spool / n.host).mkdir(parents=True, exist_ok=True)
        conf = folder / "slurm.conf"
        conf.write_text("\n".join([
            f"ClusterName={PREFIX}{self.tag}", f"SlurmctldHost={head.host}",
            "AuthType=auth/munge", "SlurmUser=root", f"StateSaveLocation={folder}/state",
            f"SlurmdSpoolDir={spool}/%n", f"SlurmctldPidFile={folder}/slurmctld.pid",
            f"SlurmdPidFile={folder}/slurmd-%n.pid", f"SlurmctldLogFile={folder}/slurmctld.log",
            f"SlurmdLogFile={folder}/slurmd-%n.log", "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "MpiDefault=none",
            *(f"NodeName={n.host} CPUs={cpus} RealMemory=1000" for n in workers),
            f"PartitionName=main Nodes={','.join(n.host for n in workers)} Default=YES "
            "MaxTime=INFINITE State=UP", ""]))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        # -c: a fresh state; the daemons go to the background, inside their node
        self.run(head.index, ["slurmctld", "-c", "-i"], env=env, check=True)
        for n in workers:
            self.run(n.index, ["slurmd"], env=env, check=True)
        return {"SLURM_CONF": str(conf)}

    def spool(self) -> Path:
        return Path(tempfile.gettempdir()) / f"{PREFIX}{self.tag}-spool"

    def down(self) -> None:
        remove(f"{PREFIX}{self.tag}-")
        shutil.rmtree(self.spool(), ignore_errors=True)

    def describe(self) -> dict:
        return {"tag": self.tag, "bridge": self.bridge,
                "nodes": [{"host": n.host, "netns": n.netns, "address": n.address}
                          for n in self.nodes]}


def remove(prefix: str = PREFIX) -> list[str]:
    """Delete every namespace whose name starts with ``prefix``, after killing the processes
    inside it (a namespace outlives its name while one runs there), and its /etc/netns folder."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.startswith(prefix)]
    if NETNS_ETC.is_dir():
        names += [p.name for p in NETNS_ETC.iterdir() if p.name.startswith(prefix)
                  and p.name not in names]
    for name in names:
        pids = _ip("netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "del", name, check=False)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    return names


def _hand(count: int = 0) -> Nodes:
    """The set made by ``up`` from the command line (its size read back from the namespaces)."""
    if not count:
        listed = _ip("netns", "list", check=False).stdout
        count = sum(1 for line in listed.splitlines()
                    if line.startswith(f"{PREFIX}{HAND_TAG}-") and "-br" not in line.split()[0])
    return Nodes(HAND_TAG, count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nodes.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    up = sub.add_parser("up", help="make K nodes (removing an earlier set made by hand)")
    up.add_argument("count", type=int)
    up.add_argument("--cap", type=float, default=0, metavar="MBIT",
                    help="bandwidth of every link, Mbit/s each way (default: uncapped)")
    down = sub.add_parser("down", help="remove the set made by up, with its processes")
    down.add_argument("--all", action="store_true",
                      help=f"every namespace named {PREFIX}*, tests' sets included")
    for name in ("cut", "mend"):
        sub.add_parser(name, help=f"{name} a node's link").add_argument("node")
    sub.add_parser("cap", help="set every link's cap (0: none)").add_argument("mbit", type=float)
    run = sub.add_parser("exec", help="run a command inside a node")
    run.add_argument("node")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"nodes.py: {why}", file=sys.stderr)
        return 2
    if args.what == "up":
        if not 1 <= args.count <= 250:
            print("nodes.py: K must be 1..250 (one /24 of addresses)", file=sys.stderr)
            return 2
        remove(f"{PREFIX}{HAND_TAG}-")
        print(json.dumps(Nodes.up(args.count, args.cap, HAND_TAG).describe(), indent=1))
    elif args.what == "down":
        for name in remove(PREFIX if args.all else f"{PREFIX}{HAND_TAG}-"):
            print(f"removed {name}")
    elif args.what == "cap":
        _hand().cap(args.mbit)
    elif args.what in ("cut", "mend"):
        getattr(_hand(), args.what)(args.node)
    else:
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        return subprocess.run(_hand().command(args.node, command or ["sh"])).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
