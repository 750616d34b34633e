"""The real node's configuration files: containerd, the CNI network, the kubelet and kube-proxy.

Pure: each renderer turns a `NodeLayout` into file text; never writes a file or starts anything
(e2e/cluster/node.py does). docs/e2e.md says why each setting is what it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "loom-e2e-node"
BRIDGE = "loom-cni0"
NETWORK = "loom-e2e"
# Pod addresses: a range of the harness's own bridge, clear of the service range (10.96.0.0/16)
# and of Docker's (172.17.0.0/16). The bridge's gateway is the node's address, so pods reach the
# API server and the host reaches pods without ever leaving this machine.
POD_CIDR = "10.233.0.0/24"
NODE_IP = "10.233.0.1"
PAUSE_IMAGE = "loom.dev/e2e/pause:1"
# Cluster DNS: CoreDNS on the host, at the node's address (pods reach it through the bridge).
CLUSTER_DOMAIN = "cluster.local"
CLUSTER_DNS = NODE_IP


@dataclass(frozen=True)
class NodeLayout:
    """Where one node keeps its state, and the ports and binaries it uses."""

    root: Path  # everything the node writes that can live under one folder
    bin_dir: Path  # containerd, ctr, the shim, loom-node
    cni_bin_dir: Path
    kubeconfig: Path
    ca_file: Path
    kubelet_port: int
    images_root: Path  # containerd's root (content, snapshots): machine-wide, so images load once

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def corefile(self) -> Path:
        return corefile_path(self.root)


def corefile_path(node_root: Path) -> Path:
    """Where a node's CoreDNS reads its Corefile (down finds a leftover CoreDNS by it)."""
    return node_root / "coredns" / "Corefile"


def containerd_config(layout: NodeLayout) -> str:
    """containerd 2.x (config version 3 schema and up): its own root, state and socket; the CRI
    plugin on the harness's CNI network and local pause image (its root, with the images, is kept
    across clusters); OOM scores clamped to containerd's
    own (negative ones are refused on these machines); Debian's runc with cgroupfs; no NRI."""
    c = layout.root / "containerd"
    return f"""version = 3
root = '{layout.images_root}'
state = '{c / "state"}'
imports = []

[grpc]
  address = '{layout.containerd_socket}'

[ttrpc]
  address = '{c / "containerd.sock.ttrpc"}'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{PAUSE_IMAGE}'

  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    enable_unprivileged_ports = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{layout.cni_bin_dir}']
      conf_dir = '{layout.cni_conf_dir}'

  [plugins.'io.containerd.nri.v1.nri']
    disable = true
"""


def cni_conflist(layout: NodeLayout) -> str:
    """The pod network: a bridge whose gateway is the node's address, host-local addresses kept
    under the node's root, hairpin for a pod reaching itself through a Service, portmap for
    hostPorts, and the firewall plugin (Docker's FORWARD policy drops pod traffic without it)."""
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": str(layout.root / "cni" / "ipam"),
    }
    bridge = {
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": ipam,
    }
    plugins = [bridge, {"type": "portmap", "capabilities": {"portMappings": True}},
               {"type": "firewall"}]  # fmt: skip
    return json.dumps({"cniVersion": "1.0.0", "name": NETWORK, "plugins": plugins}, indent=2)


def kubelet_config(layout: NodeLayout) -> str:
    """The kubelet (v1.36) on a cgroup v1, swap-tolerant machine without CAP_SYS_RESOURCE: cgroup v1
    allowed explicitly (KEP-5573), its own OOM score left alone, x509 + webhook authentication
    (the API server's client certificate for logs and exec), low eviction thresholds (one shared
    disk), no read-only or healthz port, pod logs under the node's root, and CoreDNS on the node's
    address as the pods' nameserver (no host resolv.conf: nothing outside is reachable)."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": layout.kubelet_port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(layout.ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "podCIDR": POD_CIDR,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "podLogsDir": str(layout.pod_logs),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "resolvConf": "",
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "registerNode": True,
        "maxPods": 110,
    }
    return json.dumps(config, indent=2)


def corefile(layout: NodeLayout, ready_port: int) -> str:
    """CoreDNS as the cluster DNS, on the node's address: Service and pod names under the cluster
    domain from the API server (the harness's kubeconfig), ready on loopback once it has synced;
    every other name NXDOMAIN (nothing is forwarded: pods have no network but this machine's)."""
    return f"""{CLUSTER_DOMAIN}:53 {{
    bind {CLUSTER_DNS}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {layout.kubeconfig}
    }}
}}
.:53 {{
    bind {CLUSTER_DNS}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def kube_proxy_config(layout: NodeLayout, metrics_port: int, healthz_port: int) -> str:
    """kube-proxy in iptables mode for the node's pod range; it leaves the conntrack table size and
    timeouts as they are (0 = unchanged) and its own OOM score alone."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "oomScoreAdj": 0,
        "clientConnection": {"kubeconfig": str(layout.kubeconfig)},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }
    return json.dumps(config, indent=2)


# NetworkPolicy enforcement (loom-netpol, kube-network-policies): the queue connections' first
# packets go to, and the nftables table it keeps its rules in (upstream's default name).
NETPOL_QUEUE = 100
NETPOL_TABLE = ("inet", "kube-network-policies")


def network_policies_args(layout: NodeLayout, binary: Path, metrics_port: int) -> list[str]:
    """loom-netpol's command line: the admin kubeconfig (a host process has no ServiceAccount
    files), this node's name (it enforces policies on this node's pods only), its queue, metrics
    on loopback, and no DNS workaround (kernels from 6.12 on do not need it)."""
    return [
        str(binary),
        f"--kubeconfig={layout.kubeconfig}",
        f"--hostname-override={NODE_NAME}",
        f"--nfqueue-id={NETPOL_QUEUE}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        "--netfilter-bug-1766-fix=false",
        "--v=2",
    ]
