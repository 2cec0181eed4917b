"""The cluster DNS of the test: dnsmasq in its own network namespace, answering only from a hosts
file the harness rewrites and reloads with SIGHUP (`--no-resolv --no-hosts`, `--local` for the
cluster domain so that a name without records is NXDOMAIN, TTL 0 so nothing caches).

It can also stop answering (SIGSTOP: queries time out, the resolver's temporary failure) and
serve a duplicate AAAA record next to a pod's A record (dual-stack)."""
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time

A, AAAA = 1, 28
NOERROR, SERVFAIL, NXDOMAIN, REFUSED = 0, 2, 3, 5


def _skip_name(msg, off):
    while True:
        n = msg[off]
        if n == 0:
            return off + 1
        if n & 0xC0 == 0xC0:  # compression pointer
            return off + 2
        off += 1 + n


def dns_query(server, name, qtype=A, timeout=1.0, flags_out=None, tcp_on_truncation=True):
    """One UDP query; (rcode, [addresses]) or None when the server does not answer in time.
    `flags_out`, a dict, receives the UDP answer's "truncated" bit (TC: the full answer needs
    TCP). A truncated answer is asked again over TCP, as a stub resolver does, unless
    `tcp_on_truncation` is False (then the UDP answer's records are returned)."""
    tid = random.randrange(1 << 16)
    q = struct.pack(">HHHHHH", tid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    q += struct.pack(">HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(q, (server, 53))
        end = time.monotonic() + timeout
        while True:
            try:
                s.settimeout(max(0.01, end - time.monotonic()))
                msg, _ = s.recvfrom(4096)
            except (socket.timeout, ConnectionRefusedError):
                return None
            if len(msg) >= 12 and struct.unpack(">H", msg[:2])[0] == tid:
                break
    _, flags, _, _, _, _ = struct.unpack(">HHHHHH", msg[:12])
    if flags_out is not None:
        flags_out["truncated"] = bool(flags & 0x0200)
    if flags & 0x0200 and tcp_on_truncation:
        try:
            with socket.create_connection((server, 53), timeout=timeout) as t:
                t.sendall(struct.pack(">H", len(q)) + q)
                data = b""
                while len(data) < 2 or len(data) < 2 + struct.unpack(">H", data[:2])[0]:
                    chunk = t.recv(65536)
                    if not chunk:
                        return None
                    data += chunk
            msg = data[2:2 + struct.unpack(">H", data[:2])[0]]
        except OSError:
            return None
    _, flags, qd, an, _, _ = struct.unpack(">HHHHHH", msg[:12])
    off = 12
    for _ in range(qd):
        off = _skip_name(msg, off) + 4
    addrs = []
    for _ in range(an):
        off = _skip_name(msg, off)
        typ, _, _, rdlen = struct.unpack(">HHIH", msg[off:off + 10])
        off += 10
        rdata = msg[off:off + rdlen]
        off += rdlen
        if typ == A:
            addrs.append(socket.inet_ntop(socket.AF_INET, rdata))
        elif typ == AAAA:
            addrs.append(socket.inet_ntop(socket.AF_INET6, rdata))
    return flags & 0xF, addrs


class DnsServer:
    """The cluster DNS. `ttl`: the TTL of its answers (0: nothing caches them; CoreDNS's
    kubernetes plugin answers with 5). With `upstream` (another DnsServer) it is instead a
    caching forwarder in front of it, as CoreDNS's cache plugin or NodeLocal DNSCache: answers
    are kept for their TTL (negative answers are not cached)."""

    def __init__(self, net, logdir, domain="cluster.local", ttl=0, upstream=None, name="dns"):
        self.host = net.add_host(name)
        self.ip = self.host.ip
        self.domain = domain
        self.dir = tempfile.mkdtemp(prefix="sy-k8s-dns-")  # private (0700): only dnsmasq, as root, reads it
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.records = {}  # name -> [addresses], in order
        self.paused = False
        self._lock = threading.Lock()
        self._write()
        self.log = open(os.path.join(logdir, "dnsmasq.log" if name == "dns" else f"{name}.log"), "w")
        serve = [f"--server={upstream.ip}", "--cache-size=1000"] if upstream else \
            ["--addn-hosts=" + self.hosts_file, f"--local=/{domain}/", f"--local-ttl={ttl}"]
        self.proc = subprocess.Popen(self.host.exec_argv([
            "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", *serve,
            "--listen-address=" + self.ip, "--bind-interfaces", "--port=53", "--user=root", "--no-negcache",
            "--pid-file=", "--log-queries", "--log-facility=-"]), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if dns_query(self.ip, "probe." + domain, timeout=0.2) is not None:
                return
        self.stop()
        raise RuntimeError("dnsmasq did not come up within 10 s: " + open(self.log.name).read())

    def _write(self):
        tmp = self.hosts_file + ".tmp"
        with open(tmp, "w") as f:
            for name, addrs in self.records.items():
                for a in addrs:
                    f.write(f"{a} {name}\n")
        os.replace(tmp, self.hosts_file)

    def set(self, name, addrs, verify=True):
        """Publishes `addrs` (IPv4 and IPv6 mixed) as the records of `name`; none: NXDOMAIN.
        Returns once the server answers with the new set (unless it is paused)."""
        with self._lock:
            addrs = list(dict.fromkeys(addrs))
            if addrs:
                self.records[name] = addrs
            else:
                self.records.pop(name, None)
            self._write()
            self.proc.send_signal(signal.SIGHUP)  # re-reads --addn-hosts
            if not verify or self.paused:
                return
            want4 = sorted(a for a in addrs if ":" not in a)
            want6 = sorted(a for a in addrs if ":" in a)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                r4, r6 = dns_query(self.ip, name, A, 0.3), dns_query(self.ip, name, AAAA, 0.3)
                if r4 and r6:
                    if not addrs and r4[0] == NXDOMAIN:
                        return
                    if addrs and sorted(r4[1]) == want4 and sorted(r6[1]) == want6:
                        return
                time.sleep(0.02)
            raise RuntimeError(f"dnsmasq did not start serving {name} -> {addrs} within 5 s")

    def pause(self):
        """Stops answering: queries time out (the resolver's temporary failure, EAI_AGAIN)."""
        with self._lock:
            self.paused = True
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        with self._lock:
            self.paused = False
            self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
