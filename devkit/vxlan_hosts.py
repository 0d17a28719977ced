"""Hosts made of network namespaces for the job tunnel's tests and bench (provisioning.
node_service.tunnel): nothing is shared between two "hosts" but an underlay wire.

    underlay ns `vjxu<pid>`: a bridge u0 (the cluster's switch), MTU as asked
    host ns `vjxa<pid>`, `vjxb<pid>`, `vjxc<pid>`: eth0 on u0, 198.18.40.1, .2, .3/24
    guest ns `vjg<name><pid>`: eth0 (the job's MAC and address, default route via the job's
        gateway) whose other end is a port of the job's bridge in its host's namespace

198.18.40.0/24 is in RFC 2544's benchmarking range: nothing on this machine or its network uses
it, and no packet leaves these namespaces. The node service's own operation runs inside a host's
namespace (`net_op`: one process per host, `ip netns exec` of this file, which checks each
request with the protocol and runs network_ops' net.up/net.down/sweep as the service would, with
the node addresses the topology gives through tunnel.install_addresses and a state directory
per host). The probes
(`probe`, `background`) are devkit.netns_probes (standard library only: quick to start).

The dev cluster's own hosts (devkit/devcluster_hosts.py) run real slurmds, whose NodeAddr the
node service reads from Slurm; this topology has no RMS and is the tunnel's test bed and bench
only: `tunnel.install_addresses` is how it says where its nodes are.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioning.node_service import protocol, tunnel
from provisioning.node_service.grant import Grant

PREFIX = "198.18.40"
NETWORK = f"{PREFIX}.0/24"
HOSTS = {"a": f"{PREFIX}.1", "b": f"{PREFIX}.2", "c": f"{PREFIX}.3"}
DNS = f"{PREFIX}.53"
"""A name server the guests are told of (nothing answers: no test resolves a name)."""
REPO = Path(__file__).resolve().parent.parent


_serial = itertools.count()
"""Two topologies of one process (a module's and a test's) never share a namespace name."""


@dataclass
class Topology:
    tag: str
    underlay: str
    hosts: dict[str, str]
    state: Path
    guests: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    agents: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    """Host -> the process running the node service's operations in its namespace."""


def _ip(*args: str, ns: str = "") -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=15)


def start(state: Path, mtu: int = 1500) -> Topology:
    """The underlay and three hosts on it (a and b hold the jobs' nodes, c is a stranger)."""
    tag = f"{os.getpid() % 100000}{next(_serial)}"
    topo = Topology(tag, f"vjxu{tag}", {h: f"vjx{h}{tag}" for h in HOSTS}, state)
    try:
        for ns in (topo.underlay, *topo.hosts.values()):
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=15)
            _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", "u0", "type", "bridge", "forward_delay", "0", ns=topo.underlay)
        _ip("link", "set", "u0", "mtu", str(mtu), "up", ns=topo.underlay)
        for host, ns in topo.hosts.items():
            port = f"u{host}"
            veth = ("type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "add", port, "mtu", str(mtu), *veth, ns=topo.underlay)
            _ip("link", "set", port, "master", "u0", "up", ns=topo.underlay)
            _ip("addr", "add", f"{HOSTS[host]}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "mtu", str(mtu), "up", ns=ns)
            (state / host).mkdir(mode=0o700, parents=True, exist_ok=True)
    except BaseException:
        stop(topo)
        raise
    return topo


def stop(topo: Topology) -> None:
    """Every process (by pid) and namespace of the topology; the links go with the namespaces."""
    for agent in topo.agents.values():
        if agent.stdin is not None:
            agent.stdin.close()  # its end of input: it exits
    for proc in [*topo.agents.values(), *topo.procs]:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for ns in [*topo.guests, *topo.hosts.values(), topo.underlay]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15, check=False)


def net_op(
    topo: Topology, host: str, op: str, job: str, node: str, nodes: dict[str, str], bridge: str = "", **fields: int
) -> dict:
    """The node service's `op` for `job` on `node` of host `host`; `nodes` maps the job's nodes
    to their hosts (so to their addresses); `bridge`: the host's `[guest] network = "bridge"` on
    that operator's bridge, else NAT. Returns {"answer", "ms"} (the operation's own time)."""
    agent = topo.agents.get(host)
    if agent is None:  # the host's "node service": one process, started at its first operation
        cmd = ["ip", "netns", "exec", topo.hosts[host], sys.executable, "-m", "devkit.vxlan_hosts"]
        agent = subprocess.Popen(
            [*cmd, "agent", str(topo.state / host)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        topo.agents[host] = agent
    addresses = {n: HOSTS[h] for n, h in nodes.items()}
    request = {"op": op, "job": job, "node": node, "addresses": addresses, "fields": fields, "bridge": bridge}
    assert agent.stdin is not None and agent.stdout is not None
    agent.stdin.write(json.dumps(request) + "\n")
    agent.stdin.flush()
    said = json.loads(agent.stdout.readline() or '{"error": "the host agent ended (see stderr)"}')
    if "error" in said:
        raise AssertionError(f"{op} {job} on host {host}: {said['error']}")
    return dict(said)


def guest(topo: Topology, host: str, name: str, answer_vm: dict[str, Any], bridge: str, gateway: str) -> str:
    """A guest namespace on `bridge` of host `host` with the MAC and address net.up gave a VM."""
    ns = f"vjg{name}{topo.tag}"[:15]
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=15)
    topo.guests.append(ns)
    port = f"g{name}{topo.tag}"[:15]
    _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns, ns=topo.hosts[host])
    _ip("link", "set", port, "master", bridge, "up", ns=topo.hosts[host])
    _ip("link", "set", "eth0", "address", answer_vm["mac"], ns=ns)
    _ip("addr", "add", f"{answer_vm['ip']}/24", "dev", "eth0", ns=ns)
    _ip("link", "set", "eth0", "up", ns=ns)
    _ip("link", "set", "lo", "up", ns=ns)
    _ip("route", "add", "default", "via", gateway, ns=ns)
    _wait_carrier(ns, "eth0")
    return ns


def operator_bridge(topo: Topology, host: str) -> str:
    """The operator's bridge `obr` on host `host`, its uplink a port of the underlay switch: the
    site's LAN and the cluster network are one (what docs/security.md warns of)."""
    ns, port = topo.hosts[host], f"o{host}"
    _ip("link", "add", "obr", "type", "bridge", "forward_delay", "0", ns=ns)
    _ip("link", "set", "obr", "up", ns=ns)
    _ip("link", "add", port, "type", "veth", "peer", "name", "uplink", "netns", ns, ns=topo.underlay)
    _ip("link", "set", port, "master", "u0", "up", ns=topo.underlay)
    _ip("link", "set", "uplink", "master", "obr", "up", ns=ns)
    return "obr"


def bridged_guest(topo: Topology, host: str, name: str, site_tap: str, site_mac: str, lan_ip: str) -> str:
    """A guest whose site NIC (eth1, `site_mac`, `lan_ip`/24) is on the operator's bridge, in
    place of the node service's tap there (a veth of the tap's name: the rules match names)."""
    ns, host_ns = f"vjg{name}{topo.tag}"[:15], topo.hosts[host]
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=15)
    topo.guests.append(ns)
    _ip("link", "del", site_tap, ns=host_ns)
    _ip("link", "add", site_tap, "type", "veth", "peer", "name", "eth1", "netns", ns, ns=host_ns)
    _ip("link", "set", site_tap, "master", "obr", "up", ns=host_ns)
    _ip("link", "set", "eth1", "address", site_mac, ns=ns)
    _ip("addr", "add", f"{lan_ip}/24", "dev", "eth1", ns=ns)
    _ip("link", "set", "eth1", "up", ns=ns)
    _ip("link", "set", "lo", "up", ns=ns)
    _wait_carrier(ns, "eth1")
    return ns


def _wait_carrier(ns: str, link: str) -> None:
    """Until `link` has its carrier (a veth's comes a moment after both ends are up; a frame sent
    before is lost, which would make a test of a drop pass for the wrong reason)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        state = subprocess.run(
            ["ip", "-n", ns, "-br", "link", "show", link], capture_output=True, text=True, timeout=15
        )
        if " UP " in f" {state.stdout} ":
            return
        time.sleep(0.05)
    raise AssertionError(f"{link} in {ns} has no carrier after 10 s")


def probe(ns: str, kind: str, *args: str) -> dict:
    """One probe (devkit.netns_probes) in namespace `ns`, its JSON answer."""
    return _in_ns(ns, "devkit.netns_probes", kind, *args)


def _in_ns(ns: str, module: str, *args: str) -> dict[str, Any]:
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", module, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    if res.returncode != 0:
        raise AssertionError(f"{args[:3]} in {ns}: {res.stderr[-1500:]}")
    return dict(json.loads(res.stdout.splitlines()[-1]))


def background(topo: Topology, ns: str, kind: str, *args: str) -> subprocess.Popen[str]:
    """A long probe (serve, sniff) started in `ns`, returned once it said it is ready."""
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "devkit.netns_probes", kind, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    topo.procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        said = proc.stderr.read()[-800:] if proc.stderr else ""
        raise AssertionError(f"{kind} in {ns} did not start: {line!r} {said}")
    return proc


def finish(proc: subprocess.Popen[str]) -> dict:
    """Stop a background probe (SIGTERM) and read its answer."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    if not out.strip():
        raise AssertionError(f"a probe ended without an answer: {err[-800:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def leftovers(topo: Topology, host: str) -> dict[str, list[str]]:
    """What of any job's network is left in host `host` (links, nft tables, iptables chains)."""
    ns = topo.hosts[host]

    def out(*cmd: str) -> str:
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=15).stdout

    links = [line.split(":")[1].strip().split("@")[0] for line in out("ip", "-o", "link").splitlines()]
    tables = [line for line in out("nft", "list", "tables").splitlines() if "vjob-" in line]
    chains = [c for t in ("filter", "nat") for c in out("iptables", "-t", t, "-S").splitlines() if "vjob-" in c]
    return {"links": [n for n in links if n.startswith("vjob-")], "tables": tables, "chains": chains}


# -- inside a host's namespace: the node service's operations ------------------------------------
def _agent(state_dir: str) -> None:
    """Run one operation per JSON line of stdin (a request as net_op sends it), one answer line
    each ({"answer", "ms"} or {"error"}), until stdin ends: the host's node service, as the real
    one runs them (the request checked by the protocol, the operation given a Grant)."""
    from provisioning.node_service import network_ops, site  # heavy: pydantic
    from vjob.config.composed import parse  # heavy: pydantic

    network_ops.STATE_DIR = Path(state_dir)
    nobody = pwd.getpwnam("nobody")

    class Ended:
        def grant(self, job: str, node: str) -> None:
            return None

    for line in sys.stdin:
        req = json.loads(line)
        guest = {"network": "bridge", "bridge": req["bridge"]} if req["bridge"] else {"network": "nat", "dns": [DNS]}
        site.install(parse({"guest": guest, "node": {"tunnel_networks": [NETWORK]}}))
        where: dict[str, str] = req["addresses"]
        tunnel.install_addresses(lambda nodes, where=where: {n: where[n] for n in nodes if n in where})
        grant = Grant("slurm", req["job"], nobody.pw_uid, nobody.pw_gid, "nobody", req["node"], tuple(where), 1, 256)
        t0 = time.perf_counter()
        try:
            if req["op"] == "sweep":
                answer: Any = network_ops.sweep(Ended())
            else:
                fields = {"op": req["op"], "job": req["job"], "node": req["node"], **req["fields"]}
                answer = network_ops.OPERATIONS[req["op"]].run(
                    grant, protocol.check(fields, network_ops.OPERATIONS).fields
                )
            said: dict[str, Any] = {"answer": answer, "ms": round((time.perf_counter() - t0) * 1000, 1)}
        except Exception as exc:  # noqa: BLE001 - the test is told, the agent goes on
            said = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(said), flush=True)


if __name__ == "__main__":
    _agent(sys.argv[2])
