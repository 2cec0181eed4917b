"""The test's own small "cluster network": one Linux bridge, one network namespace per pod with a
veth pair into the bridge and an address from a private /24 picked for this run. The bridge
itself holds .1 (the "node": the test process reaches the pods through it); nothing has a
default route, so traffic stays on the bridge and on each namespace's loopback.

Everything created is recorded and removed by close(), which is idempotent and also runs at
interpreter exit for anything a crashed test left behind."""
import atexit
import ipaddress
import os
import random
import shutil
import subprocess
import threading

_live = set()  # networks not closed yet (closed at exit if a test could not)
_live_lock = threading.Lock()
OWNERS = "/run/sy-k8s"  # one file per live network: its prefix, holding the owning process's pid


def sh(*argv, check=True, timeout=20, input=None):
    """Runs a command (no shell); raises with its stderr when it fails and `check` is set."""
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def _used_ipv4_networks():
    out = sh("ip", "-4", "-o", "addr", "show", check=False).stdout + sh("ip", "-4", "route", "show", check=False).stdout
    nets = []
    for tok in out.split():
        try:
            nets.append(ipaddress.ip_network(tok, strict=False))
        except ValueError:
            pass
    return nets


def pick_subnet(rng):
    """A 10.x.y.0/24 that overlaps no address or route on this machine."""
    used = _used_ipv4_networks()
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randint(160, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free private /24 found for the test network")


def netns_available():
    """(True, '') when this process can create namespaces, bridges and veth pairs; else (False, why)."""
    if os.geteuid() != 0:
        return False, "not root: network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN"
    if shutil.which("ip") is None:
        return False, "no `ip` (iproute2) on PATH"
    tag = f"sykp{os.getpid() % 100000}"
    try:
        sh("ip", "netns", "add", tag)
        try:
            sh("ip", "link", "add", tag + "b", "type", "bridge")
            sh("ip", "link", "add", tag + "v", "type", "veth", "peer", "name", tag + "p")
            sh("ip", "link", "set", tag + "p", "netns", tag)
            sh("ip", "netns", "exec", tag, "true")
        finally:
            sh("ip", "link", "del", tag + "v", check=False)
            sh("ip", "link", "del", tag + "b", check=False)
            sh("ip", "netns", "del", tag, check=False)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return False, f"cannot create a network namespace, bridge and veth pair here: {e}"
    return True, ""


_impairment = None


def link_impairment():
    """How this machine can make a pod's link lossy and slow: ("netem", "") when the kernel has the
    netem qdisc (delay, jitter, loss), ("nft+tbf", "") when it has nftables' random drops and the
    token-bucket qdisc instead (loss, and the queueing delay of a slow link), else (None, why).
    Probed once in a namespace of its own."""
    global _impairment
    if _impairment is not None:
        return _impairment
    tag = f"sykq{os.getpid() % 100000}"
    try:
        sh("ip", "netns", "add", tag)
        try:
            ns = ["ip", "netns", "exec", tag]
            if sh(*ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", check=False).returncode == 0:
                _impairment = ("netem", "")
            elif shutil.which("nft") is None:
                _impairment = (None, "the kernel has no netem qdisc and `nft` (package nftables) is not installed")
            else:
                ok = sh(*ns, "nft", "add table inet p; add chain inet p c { type filter hook input priority 0; }; "
                        "add rule inet p c numgen random mod 1000 < 30 drop", check=False).returncode == 0
                ok = ok and sh(*ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "2mbit", "burst", "16kb",
                               "latency", "200ms", check=False).returncode == 0
                _impairment = ("nft+tbf", "") if ok else (None, "neither netem nor nftables + tbf work in this kernel")
        finally:
            sh("ip", "netns", "del", tag, check=False)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        _impairment = (None, f"cannot probe link impairment: {e}")
    return _impairment


class Host:
    """One network namespace on the bridge (a pod's network)."""

    def __init__(self, net, name, index):
        self.net, self.name, self.index = net, name, index
        self.ns = f"{net.prefix}-{name}"
        self.ip = str(net.subnet.network_address + index)
        self.veth = f"{net.prefix}v{index}"  # the root-namespace end, on the bridge
        self.etc_dir = os.path.join("/etc/netns", self.ns)  # `ip netns exec` binds these over /etc
        self.ipv6 = None

    def exec_argv(self, argv):
        return ["ip", "netns", "exec", self.ns, *argv]

    def set_resolver(self, nameserver, timeout_s=1, attempts=1, search=None):
        """/etc/resolv.conf (and a hosts file with only localhost) as processes in this namespace see
        them: `ip netns exec` bind-mounts /etc/netns/<ns>/* over /etc/*. With a `search` list it is
        the one the kubelet writes for a ClusterFirst pod: the namespace's search domains and
        ndots:5 (glibc's own timeout and attempts)."""
        os.makedirs(self.etc_dir, exist_ok=True)
        with open(os.path.join(self.etc_dir, "resolv.conf"), "w") as f:
            if search:
                f.write(f"search {' '.join(search)}\nnameserver {nameserver}\noptions ndots:5\n")
            else:
                f.write(f"nameserver {nameserver}\noptions timeout:{timeout_s} attempts:{attempts}\n")
        with open(os.path.join(self.etc_dir, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost\n")

    def impair(self, loss_percent, delay_ms):
        """Makes this pod's link lossy and slow both ways (see link_impairment()): with netem,
        `delay_ms` +- a third of it and `loss_percent` on eth0 and on its bridge end; otherwise
        nftables drops `loss_percent` of the packets in and out, and a 2 Mbit/s token bucket on
        both ends queues what the link carries. Returns the method used."""
        how, why = link_impairment()
        if how is None:
            raise RuntimeError(why)
        if how == "netem":
            for argv in (["ip", "netns", "exec", self.ns, "tc"], ["tc"]):
                dev = "eth0" if len(argv) > 1 else self.veth
                sh(*argv, "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{delay_ms}ms",
                   f"{max(1, delay_ms // 3)}ms", "loss", f"{loss_percent}%")
            return how
        per_mille = int(loss_percent * 10)
        sh("ip", "netns", "exec", self.ns, "nft",
           "add table inet impair; "
           "add chain inet impair in { type filter hook input priority 0; }; "
           "add chain inet impair out { type filter hook output priority 0; }; "
           f"add rule inet impair in numgen random mod 1000 < {per_mille} counter drop; "
           f"add rule inet impair out numgen random mod 1000 < {per_mille} counter drop")
        sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit",
           "burst", "16kb", "latency", "400ms")
        sh("tc", "qdisc", "add", "dev", self.veth, "root", "tbf", "rate", "2mbit", "burst", "16kb", "latency", "400ms")
        return how

    def dropped_packets(self):
        """Packets impair()'s nftables rules dropped so far (0 with netem, whose drops are not counted)."""
        if shutil.which("nft") is None:
            return 0
        out = sh("ip", "netns", "exec", self.ns, "nft", "list table inet impair", check=False).stdout
        return sum(int(w[i + 1]) for w in (line.split() for line in out.splitlines())
                   for i, x in enumerate(w[:-1]) if x == "packets")

    def repair(self):
        """Undoes impair()."""
        sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        sh("tc", "qdisc", "del", "dev", self.veth, "root", check=False)
        if shutil.which("nft"):
            sh("ip", "netns", "exec", self.ns, "nft", "delete table inet impair", check=False)

    def add_ipv6(self, addr):
        """A second (IPv6) address on eth0, as a dual-stack pod has (no DAD wait)."""
        sh("ip", "-n", self.ns, "-6", "addr", "add", f"{addr}/64", "dev", "eth0", "nodad")
        self.ipv6 = addr


class Network:
    def __init__(self, seed=None):
        rng = random.Random(seed)
        existing = sh("ip", "netns", "list", check=False).stdout
        for _ in range(100):
            run_id = "%04x" % rng.randrange(1 << 16)
            if f"syk{run_id}-" not in existing:
                break
        self.prefix = f"syk{run_id}"  # 7 characters: names stay under IFNAMSIZ
        self.bridge = self.prefix + "br"
        self.subnet = pick_subnet(rng)
        self.gateway = str(self.subnet.network_address + 1)
        # A ULA /64 for the AAAA records of dual-stack pods (fd + 40 random bits).
        self.ula = ipaddress.ip_network("fd%02x:%04x:%04x::/64" % (rng.randrange(256), rng.randrange(1 << 16),
                                                                   rng.randrange(1 << 16)))
        self.hosts = {}
        self._next = 2
        self._lock = threading.Lock()
        self._closed = False
        self._made_etc_netns = not os.path.isdir("/etc/netns")
        with _live_lock:
            _live.add(self)
        os.makedirs(OWNERS, exist_ok=True)
        with open(os.path.join(OWNERS, self.prefix), "w") as f:
            f.write(str(os.getpid()))
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
        except Exception:
            self.close()
            raise

    def ipv6_of(self, host):
        return str(self.ula.network_address + host.index)

    def add_host(self, name):
        with self._lock:
            if self._closed:
                raise RuntimeError("network closed")
            index = self._next
            if index > 253:  # .254: the router Service's ClusterIP (k8s_proxy)
                raise RuntimeError("the test's /24 is exhausted")
            self._next += 1
            h = Host(self, name, index)
            self.hosts[name] = h
        peer = f"{self.prefix}p{index}"
        try:
            sh("ip", "netns", "add", h.ns)
            sh("ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", h.ns)
            sh("ip", "link", "set", h.veth, "master", self.bridge, "up")
            sh("ip", "-n", h.ns, "link", "set", peer, "name", "eth0")
            sh("ip", "-n", h.ns, "addr", "add", f"{h.ip}/{self.subnet.prefixlen}", "dev", "eth0")
            sh("ip", "-n", h.ns, "link", "set", "eth0", "up")
            sh("ip", "-n", h.ns, "link", "set", "lo", "up")
        except Exception:
            self.remove_host(name)
            raise
        return h

    def remove_host(self, name):
        """Deletes the namespace (its address disappears from the bridge, like a deleted pod's IP).
        The processes in it must be gone first."""
        with self._lock:
            h = self.hosts.pop(name, None)
        if h is None:
            return
        sh("ip", "link", "del", h.veth, check=False)
        sh("ip", "netns", "del", h.ns, check=False)
        shutil.rmtree(h.etc_dir, ignore_errors=True)

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            names = list(self.hosts)
        for name in names:
            self.remove_host(name)
        sh("ip", "link", "del", self.bridge, check=False)
        if self._made_etc_netns:
            try:
                os.rmdir("/etc/netns")  # only if empty: another run may be using it
            except OSError:
                pass
        try:
            os.remove(os.path.join(OWNERS, self.prefix))
        except OSError:
            pass
        with _live_lock:
            _live.discard(self)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def sweep_stale():
    """Removes what an earlier run killed outright (SIGKILL, no clean-up) left behind: for each
    network whose owning process is gone, the processes inside its namespaces, the namespaces,
    the veths, the bridge and the /etc/netns files. Runs of other live processes are left alone."""
    if not os.path.isdir(OWNERS):
        return []
    swept = []
    for prefix in os.listdir(OWNERS):
        path = os.path.join(OWNERS, prefix)
        try:
            pid = int(open(path).read().strip() or 0)
        except (OSError, ValueError):
            continue
        if not prefix.startswith("syk") or (pid and _pid_alive(pid)):
            continue
        for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
            ns = line.split()[0] if line.split() else ""
            if not ns.startswith(prefix + "-"):
                continue
            for p in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(p), 9)
                except (OSError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
            shutil.rmtree(os.path.join("/etc/netns", ns), ignore_errors=True)
        for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
            parts = line.split(":")
            name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
            if name.startswith(prefix):
                sh("ip", "link", "del", name, check=False)
        for table in (f"{prefix}kp", f"{prefix}kpf") if shutil.which("nft") else ():  # k8s_proxy's tables
            sh("nft", f"delete table ip {table}", check=False)
        os.remove(path)
        swept.append(prefix)
    if swept:
        try:
            os.rmdir("/etc/netns")  # only if empty
        except OSError:
            pass
    return swept


@atexit.register
def _close_leftovers():
    with _live_lock:
        nets = list(_live)
    for n in nets:
        try:
            n.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
