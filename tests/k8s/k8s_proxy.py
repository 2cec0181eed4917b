"""kube-proxy for the router Service: a ClusterIP on the test's bridge that the node (the test
process, where clients run) connects to, NATed to a ready router pod per connection.

An nftables table in the root namespace (`<prefix>kp`, removed by `close()` and by the sweep of
a killed run's leftovers, k8s_net.sweep_stale) DNATs new connections to the ClusterIP's port to
one of the Service's endpoints at random (kube-proxy's nftables mode); conntrack keeps every
established connection on the pod it was given, also once that pod is terminating and out of the
endpoints: only new connections follow the change, as with kube-proxy. With no endpoint, new
connections are refused (TCP reset). Endpoint changes are applied `Service.lag_s` after the
kubelet makes them (the Service's view; k8s_kubelet.Service)."""
import shutil
import threading

from k8s_net import sh


def proxy_available():
    return shutil.which("nft") is not None


class ClusterIP:
    def __init__(self, net, service, port):
        self.net, self.service, self.port = net, service, port
        self.ip = str(net.subnet.network_address + 254)  # add_host stops at .253 (k8s_net)
        self.table = f"{net.prefix}kp"
        self.applied = None
        self.history = []  # endpoints sets applied, in order
        self._stop = threading.Event()
        sh("nft", f"add table ip {self.table}")
        sh("nft", f"add chain ip {self.table} out {{ type nat hook output priority -100; }}")
        sh("nft", f"add chain ip {self.table} svc")
        sh("nft", f"add rule ip {self.table} out ip daddr {self.ip} tcp dport {port} jump svc")
        # Refused while the table is being filled (no endpoint yet).
        sh("nft", f"add table ip {self.table}f")
        sh("nft", f"add chain ip {self.table}f f {{ type filter hook output priority 0; }}")
        self._sync()
        self._thread = threading.Thread(target=self._run, name="kube-proxy", daemon=True)
        self._thread.start()

    def _rules(self, eps):
        if not eps:
            return [f"add rule ip {self.table}f f ip daddr {self.ip} tcp dport {self.port} reject with tcp reset"]
        pick = ", ".join(f"{i} : {ip}" for i, ip in enumerate(eps))
        return [f"add rule ip {self.table} svc dnat to numgen random mod {len(eps)} map {{ {pick} }}"]

    def _sync(self):
        eps = tuple(sorted(self.service.endpoints()))
        if eps == self.applied:
            return
        script = [f"flush chain ip {self.table} svc", f"flush chain ip {self.table}f f", *self._rules(eps)]
        p = sh("nft", "-f", "-", check=False, input="\n".join(script) + "\n")
        if p.returncode != 0:
            raise RuntimeError(f"nft: {p.stderr.strip()}")
        self.applied = eps
        self.history.append(eps)

    def _run(self):
        while not self._stop.wait(0.05):
            try:
                self._sync()
            except RuntimeError:
                pass  # retried at the next tick

    def close(self):
        self._stop.set()
        self._thread.join(5)
        sh("nft", f"delete table ip {self.table}", check=False)
        sh("nft", f"delete table ip {self.table}f", check=False)
