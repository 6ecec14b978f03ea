"""Nothing a job listens on is reachable beyond loopback (one machine), and a store for a world
whose rank 0 is elsewhere listens on one interface only."""

import ipaddress
import socket
import subprocess
import time

import psutil
import pytest

from helpers import cli, tree


def outside_address() -> str | None:
    """An IPv4 address of this machine that is not loopback."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


def connect(address: str, port: int) -> str:
    with socket.socket() as sock:
        sock.settimeout(5)
        try:
            sock.connect((address, port))
        except OSError as exc:
            return type(exc).__name__
    return "accepted"


def test_a_store_for_a_host_elsewhere_listens_on_one_interface_never_on_all():
    """A multi-node world may name a MASTER_ADDR that is not this machine (torchrun's c10d
    rendezvous puts rank 0 anywhere): the store takes this machine's address on the route there."""
    from parascale.runtime.local import address_towards, open_store

    elsewhere = "198.51.100.7"  # TEST-NET-2: documentation only, never an address of this machine
    try:
        expected = address_towards(elsewhere)
    except OSError:
        pytest.skip("this machine has no route beyond loopback")
    store = open_store(host=elsewhere, timeout_s=5)
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port]
    assert store.host == expected != elsewhere
    assert [a.ip for a in listening] == [expected], listening
    del store


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [["--sync", "allreduce"],
                                      ["--sync", "parameter-server", "--ps-servers", "2"]])
def test_every_listening_socket_of_a_job_is_on_loopback(tmp_path, strategy):
    outside = outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect through")
    # rank 0 sleeps 50 ms a step: 3 s of training, a dozen looks at every process's sockets
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "60", "--timeout", "60",
               "--no-save-model", "--out", str(tmp_path / "run"), *strategy,
               tmpdir=tmp_path / "tmp", fault="slow@0:0.05", stdout=subprocess.DEVNULL,
               stderr=subprocess.PIPE)
    listening: dict[tuple[str, int], tuple[str, str]] = {}  # (ip, port) -> (process, connect)
    while proc.poll() is None:
        for p in tree(proc.pid):
            try:
                sockets = [c for c in p.net_connections(kind="inet")
                           if c.status == psutil.CONN_LISTEN]
                # a worker forked from the fork server has that server's command line
                name = p.name() if p.name().startswith("parascale-r") else \
                    " ".join(p.cmdline()[1:3])
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            for c in sockets:
                if (c.laddr.ip, c.laddr.port) not in listening:
                    listening[c.laddr.ip, c.laddr.port] = (name, connect(outside, c.laddr.port))
        time.sleep(0.25)
    assert proc.wait() == 0, proc.stderr.read()
    kinds = {name for name, _ in listening.values()}
    assert "-m parascale" in kinds, listening  # the launcher's store
    assert {"parascale-r0", "parascale-r1"} <= kinds, listening  # the workers' gloo
    if "parameter-server" in strategy:
        assert "-m parascale.sync.ps_server" in kinds, listening
    beyond = {k: v for k, v in listening.items() if not ipaddress.ip_address(k[0]).is_loopback}
    assert beyond == {}, beyond
    reached = {k: v for k, v in listening.items() if v[1] != "ConnectionRefusedError"}
    assert reached == {}, f"through {outside}: {reached}"
