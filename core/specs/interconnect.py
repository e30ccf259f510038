"""GPU interconnects: a datasheet table of links, and the cluster a run is placed on.

Bandwidth convention: ``Link.bytes_per_s`` is what **one GPU can send in one
direction** (and, at the same time, receive in the other). Vendors headline
the sum of both directions: H100/H200 SXM "NVLink 900 GB/s" is 450 GB/s each
way, A100 SXM 600 GB/s is 300, B200 1.8 TB/s is 900, "PCIe Gen5 128 GB/s" is
64. This is the *B* of nccl-tests' bus bandwidth (doc/PERFORMANCE.md: "each
rank has a bandwidth to the outside world of B"; "the measurement is of a
unidirectional bandwidth"), so headroom.core.timing.comm compares bus bytes with it directly.
Network rows are per GPU with one NIC per GPU (DGX/HGX H100, H200, B200 and
A100 have eight compute-fabric ports for eight GPUs); line rates in Gb/s are
divided by 8.

Latency convention: ``Link.latency_s`` is the cost of one step of a ring
(one hop, one chunk). Values are NCCL's own tuning model (src/graph/tuning.cc,
``hwLat``, Ring algorithm, Simple protocol: NVLink 3.4 us, PCI 5.7 us,
network 14.0 us per hop); NCCL adds a per-call base latency (``baseLat``,
8.4 us for Ring/Simple) that headroom.core.timing.comm does not count. Across nodes a ring's hops between nodes
take the network's latency and the others the node link's, as the tuning model counts them
(headroom.core.timing.collective_ops.ring_latency_s). Rows NCCL does not
describe say "assumed".
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

from headroom.core.errors import ConfigError
from headroom.core.specs.hardware import get_hardware
from headroom.core.timing.collective_curves import CollectiveCurves

_GB = 10**9
_NCCL_HWLAT = "NCCL src/graph/tuning.cc hwLat, Ring/Simple per-hop latency"


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    key: str
    """Short name used on the command line, e.g. ``nvlink4``."""
    name: str
    """What the link is, in words."""
    bytes_per_s: float
    """Per GPU, per direction, bytes/s (half the bidirectional figure vendors headline)."""
    latency_s: float
    """Seconds per ring step (one hop)."""
    source: str
    """Where the bandwidth and latency come from."""
    mesh_links: int = 0
    """A full mesh without a switch: the direct links each GPU has, ``bytes_per_s`` their sum. 0: a switch,
    which gives any group all of ``bytes_per_s``."""

    def for_group(self, op: str, group_size: int) -> Link:
        """The link as one collective sees it. On a mesh a GPU reaches each peer over a link of its own:
        a collective of n ranks drives n - 1 of them at once (its rings, or all-to-all's pairs, run one per
        link), a send to one neighbour one of them."""
        if not self.mesh_links:
            return self
        used = 1 if op == "send_recv" else min(max(group_size - 1, 1), self.mesh_links)
        if used == self.mesh_links:
            return self
        return replace(self, name=f"{self.name}: {used} of its {self.mesh_links} links",
                       bytes_per_s=self.bytes_per_s * used / self.mesh_links)


LINKS: tuple[Link, ...] = (
    Link(
        key="nvlink3", name="NVLink 3 via NVSwitch (A100 SXM)", bytes_per_s=300 * _GB, latency_s=3.4e-6,
        source=f"NVIDIA A100 datasheet (2021): NVLink 600 GB/s per GPU, both directions, halved; "
               f"{_NCCL_HWLAT} (NVLink)",
    ),
    Link(
        key="nvlink4", name="NVLink 4 via NVSwitch (H100/H200 SXM)", bytes_per_s=450 * _GB, latency_s=3.4e-6,
        source=f"NVIDIA H100 (2023) and H200 (2024) datasheets: NVLink 900 GB/s per GPU, both directions, halved; "
               f"{_NCCL_HWLAT} (NVLink)",
    ),
    Link(
        key="nvlink5", name="NVLink 5 via NVLink Switch (B200)", bytes_per_s=900 * _GB, latency_s=3.4e-6,
        source=f"NVIDIA HGX B200 datasheet (2024): NVLink 1.8 TB/s per GPU, both directions, halved; "
               f"{_NCCL_HWLAT} (NVLink; Hopper-era figure, assumed for Blackwell)",
    ),
    Link(
        key="pcie4-x16", name="PCIe 4.0 x16", bytes_per_s=32 * _GB, latency_s=5.7e-6,
        source=f"NVIDIA A100 PCIe and L40S datasheets: PCIe Gen4 x16 64 GB/s, both directions, halved "
               f"(PCI-SIG: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s raw); {_NCCL_HWLAT} (PCI)",
    ),
    Link(
        key="pcie5-x16", name="PCIe 5.0 x16", bytes_per_s=64 * _GB, latency_s=5.7e-6,
        source=f"NVIDIA H100 PCIe datasheet (2023): PCIe Gen5 128 GB/s, both directions, halved "
               f"(PCI-SIG: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s raw); {_NCCL_HWLAT} (PCI)",
    ),
    Link(
        # A full mesh, not a switch: 448 GB/s only when a GPU talks to all 7 peers
        # at once (as ring/all-to-all collectives over 8 GPUs do); a pair gets 64 (Link.for_group).
        key="infinity-fabric", name="AMD Infinity Fabric mesh, 7 links (MI300X)", bytes_per_s=448 * _GB,
        latency_s=3.4e-6, mesh_links=7,
        source="AMD Instinct MI300X data sheet (2023): 7 Infinity Fabric links x 128 GB/s peak (both directions) "
               "= 896 GB/s aggregate, halved, 64 GB/s a link each way, each link to one of the 7 peers of an "
               "8-GPU platform; latency assumed equal to NCCL's NVLink hop (RCCL not checked)",
    ),
    Link(
        key="ib-hdr", name="InfiniBand HDR 200 Gb/s, one NIC per GPU", bytes_per_s=25 * _GB, latency_s=14.0e-6,
        source=f"NVIDIA ConnectX-6 datasheet: HDR 200 Gb/s per port (DGX A100: 8 single-port HDR NICs for "
               f"8 GPUs); {_NCCL_HWLAT} (network)",
    ),
    Link(
        key="ib-ndr", name="InfiniBand NDR 400 Gb/s, one NIC per GPU", bytes_per_s=50 * _GB, latency_s=14.0e-6,
        source=f"NVIDIA ConnectX-7 datasheet: NDR 400 Gb/s per port (DGX H100/H200/B200: 8 single-port "
               f"ConnectX-7 for 8 GPUs); {_NCCL_HWLAT} (network)",
    ),
    Link(
        key="roce-200g", name="RoCE v2 over 200 GbE, one NIC per GPU", bytes_per_s=25 * _GB, latency_s=14.0e-6,
        source=f"IEEE 802.3bs 200GBASE line rate, /8; {_NCCL_HWLAT} (network; assumed equal to InfiniBand)",
    ),
    Link(
        key="roce-400g", name="RoCE v2 over 400 GbE, one NIC per GPU", bytes_per_s=50 * _GB, latency_s=14.0e-6,
        source=f"IEEE 802.3bs 400GBASE line rate, /8; {_NCCL_HWLAT} (network; assumed equal to InfiniBand)",
    ),
)

LINKS_BY_KEY: dict[str, Link] = {link.key: link for link in LINKS}

INTRA_NODE_LINK: dict[str, str] = {
    "h100-sxm": "nvlink4",
    "h100-hbm2e": "nvlink4",
    "h200": "nvlink4",
    "b200": "nvlink5",
    "a100-sxm-80gb": "nvlink3",
    "a100-sxm-40gb": "nvlink3",
    # PCIe cards talk over PCIe (an NVLink bridge, where fitted, joins pairs only).
    "h100-pcie": "pcie5-x16",
    "a100-pcie-80gb": "pcie4-x16",
    "a100-pcie-40gb": "pcie4-x16",
    "l40s": "pcie4-x16",
    "rtx-4090": "pcie4-x16",
    "mi300x": "infinity-fabric",
}
"""Hardware key (headroom.core.specs.hardware) -> the link between GPUs of one node."""

DEFAULT_INTER_NODE_LINK = "ib-ndr"
"""Between nodes of a device without a row in ``INTER_NODE_LINK`` (a CPU, a GPU with no datasheet row)."""

INTER_NODE_LINK: dict[str, str] = {
    # NVIDIA's reference nodes, one NIC per GPU: DGX A100 8 x HDR (ConnectX-6), DGX H100/H200/B200 8 x NDR
    # (ConnectX-7), as the links' sources say; the PCIe cards of a generation as its SXM nodes.
    "a100-sxm-80gb": "ib-hdr",
    "a100-sxm-40gb": "ib-hdr",
    "a100-pcie-80gb": "ib-hdr",
    "a100-pcie-40gb": "ib-hdr",
    "h100-sxm": "ib-ndr",
    "h100-pcie": "ib-ndr",
    "h200": "ib-ndr",
    # Grand Teton: "backend RDMA network with 400 Gb/s per GPU" (torchtitan docs/performance.md), taken as RoCE
    # (NDR's rate and latency here too).
    "h100-hbm2e": "roce-400g",
    "b200": "ib-ndr",
    # Assumed: MI300X platforms ship 400 Gb/s Ethernet NICs; L40S and RTX 4090 servers 200 Gb/s Ethernet.
    "mi300x": "roce-400g",
    "l40s": "roce-200g",
    "rtx-4090": "roce-200g",
}
"""Hardware key (headroom.core.specs.hardware) -> the link between nodes a plan assumes unless told (``--interconnect``): the
network of the GPU's generation."""


def default_inter_node_link(device: str) -> str:
    """The link between nodes of ``device`` (a datasheet key or a device name torch reports) by its generation
    (`INTER_NODE_LINK`), else ``DEFAULT_INTER_NODE_LINK``."""
    try:
        return INTER_NODE_LINK.get(get_hardware(device).key, DEFAULT_INTER_NODE_LINK)
    except ConfigError:
        return DEFAULT_INTER_NODE_LINK


def get_link(key: str) -> Link:
    """A link by key; an unknown key suggests the closest ones."""
    wanted = key.strip().lower()
    if wanted in LINKS_BY_KEY:
        return LINKS_BY_KEY[wanted]
    raise ConfigError(f"unknown interconnect {key!r}; {_closest(wanted)}, or NICs x Gb/s a node ({NETWORK_EXAMPLE})")


def intra_node_link(key: str) -> Link:
    """The link between a node's GPUs named ``key``; an unknown key suggests the closest ones."""
    wanted = key.strip().lower()
    if wanted in LINKS_BY_KEY:
        return LINKS_BY_KEY[wanted]
    raise ConfigError(f"unknown link {key!r} between the GPUs of a node; {_closest(wanted)}")


def _closest(wanted: str) -> str:
    close = difflib.get_close_matches(wanted, LINKS_BY_KEY, n=3, cutoff=0.4)
    return f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(LINKS_BY_KEY)}"


NETWORK_EXAMPLE = "4x200g: four 200 Gb/s NICs a node"
_NETWORK = re.compile(r"^(?P<nics>\d+)\s*x\s*(?P<rate>\d+(?:\.\d+)?)\s*(?:g|gb/s|gbps|gbit/s|gbe)?$")
MAX_NICS, MAX_NIC_GBIT_S = 64, 3200


def network(text: str) -> tuple[Link, int]:
    """The link between nodes named by ``text``, and the NICs a node has (0: one per GPU, as every row of
    `LINKS`). ``text`` is a row's key, or a network described by its NICs a node and their line rate,
    ``NxRATE`` in Gb/s ("4x200g", "8 x 400 Gb/s"): each NIC's bandwidth is its line rate / 8, its latency
    NCCL's network hop. ConfigError names what is wrong."""
    found = _NETWORK.match(text.strip().lower())
    if found is None:
        return get_link(text), 0
    nics, rate = int(found["nics"]), float(found["rate"])
    if not 0 < nics <= MAX_NICS or not 0 < rate <= MAX_NIC_GBIT_S:
        raise ConfigError(f"interconnect {text!r}: NICs a node must be 1-{MAX_NICS} and each NIC's line rate "
                          f"0-{MAX_NIC_GBIT_S:,} Gb/s, as in {NETWORK_EXAMPLE}")
    key = f"{nics}x{rate:g}g"
    return Link(key=key, name=f"{nics} x {rate:g} Gb/s NICs a node", bytes_per_s=rate * _GB / 8, latency_s=14.0e-6,
                source=f"given: {nics} NICs of {rate:g} Gb/s a node, line rate / 8; {_NCCL_HWLAT} (network)"), nics


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkSettings:
    """A cluster's network as a user describes it (``--network FILE``): what ``--gpus-per-node``, ``--intra-node``
    and ``--interconnect`` say, each None where left out."""

    gpus_per_node: int | None = None
    intra_node: str | None = None
    """A `LINKS` key for the link between GPUs of one node."""
    interconnect: str | None = None
    """Between nodes: a `LINKS` key, or NICs x Gb/s a node (`network`)."""


NETWORK_KEYS: dict[str, type] = {"gpus_per_node": int, "intra_node": str, "interconnect": str}
"""The keys a network file may hold, and the type of each value."""
MAX_GPUS_PER_NODE = 1024
"""GPUs one node may hold at most: NVL72 racks are 72, and no NVLink domain announced reaches 1,024."""


def network_settings(values: object, source: str) -> NetworkSettings:
    """``values`` (a parsed network file, named ``source`` in errors) as settings; ConfigError names an unknown
    key, a value of the wrong type and a link or network that is not one, with what would be valid."""
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: a network file is a table of {', '.join(NETWORK_KEYS)}")
    unknown = sorted(set(values) - set(NETWORK_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"a network file holds {', '.join(NETWORK_KEYS)}")
    for key, value in values.items():
        kind = NETWORK_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ConfigError(f"{source}: {key} must be {'a whole number' if kind is int else 'a string'}, got "
                              f"{value!r}")
    settings = NetworkSettings(**values)
    gpus = settings.gpus_per_node
    if gpus is not None and not 0 < gpus <= MAX_GPUS_PER_NODE:
        raise ConfigError(f"{source}: gpus_per_node must be 1 to {MAX_GPUS_PER_NODE:,}, got {gpus}")
    try:
        if settings.intra_node is not None:
            intra_node_link(settings.intra_node)
        if settings.interconnect is not None:
            network(settings.interconnect)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    return settings


NET_OVERHEAD_S: dict[str, float] = {"intel": 1e-6, "amd": 2e-6, "other": 1e-6}
"""NCCL's per-post network overhead by the host's CPU (``getNetOverhead`` in src/graph/tuning.cc: 1 us on x86
Intel, 2 us on x86 AMD, 1 us otherwise)."""
HOST_CPU: dict[str, str] = {
    # DGX A100: dual AMD EPYC 7742 (NVIDIA DGX A100 datasheet); DGX H100, H200 and B200: Intel Xeon Platinum 8480C
    # and 8570 (their datasheets); the rest as NCCL's default.
    "a100-sxm-80gb": "amd",
    "a100-sxm-40gb": "amd",
}
"""Hardware key (headroom.core.specs.hardware) -> the CPU of the reference node its default cluster stands for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    gpus_per_node: int
    """GPUs that share the intra-node link (8 on HGX/DGX boards)."""
    intra: Link
    """Between GPUs of one node."""
    inter: Link
    """Between nodes: one NIC's bandwidth."""
    nics_per_node: int = 0
    """NICs a node (a network given as NxRATE, `network`); 0: one per GPU, as every datasheet network row."""
    assumed: str = ""
    """Why a link is a stand-in rather than the device's own (empty when both are its datasheet's)."""
    measured: CollectiveCurves | None = None
    """Collective times measured on this cluster: on one node, they replace ``intra`` for groups inside a node;
    across nodes (CollectiveCurves.across_nodes), ``inter`` for groups that span nodes
    (headroom.core.timing.comm)."""
    net_overhead_s: float = NET_OVERHEAD_S["intel"]
    """What the host adds to each network post (NCCL's ``getNetOverhead``, by the host's CPU: `NET_OVERHEAD_S`)."""

    @property
    def spanning_hop_s(self) -> float:
        """The latency of a ring's hop inside a node when the ring spans nodes: the node link's, but no less than
        the network's post overhead, three times ``getNetOverhead`` under NCCL's Simple protocol, the one large
        messages run (src/graph/tuning.cc: ``intraLat = std::max(intraLat, netOverhead)``)."""
        return max(self.intra.latency_s, 3 * self.net_overhead_s)

    @property
    def measured_inside(self) -> bool:
        """Some collective was measured inside one node."""
        return self.measured is not None and bool(self.measured.curves)

    def __post_init__(self) -> None:
        value = self.gpus_per_node
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_GPUS_PER_NODE:
            raise ConfigError(f"gpus-per-node must be an integer from 1 to {MAX_GPUS_PER_NODE:,}, got {value!r}")
        nics = self.nics_per_node
        if isinstance(nics, bool) or not isinstance(nics, int) or not 0 <= nics <= MAX_NICS:
            raise ConfigError(f"NICs a node must be 0 (one per GPU) to {MAX_NICS}, got {nics!r}")
        for name in ("intra", "inter"):
            if not isinstance(getattr(self, name), Link):
                raise ConfigError(f"{name} must be a headroom.core.specs.interconnect.Link, got {getattr(self, name)!r}; "
                                  f"use get_link() with one of {', '.join(LINKS_BY_KEY)}")


def default_cluster(hardware_key: str, gpus_per_node: int = 8, inter: str | None = None,
                    measured: CollectiveCurves | None = None, intra: str | None = None) -> Cluster:
    """Nodes of ``gpus_per_node`` GPUs on ``intra`` (by default that GPU's own link), joined by ``inter`` (by
    default its generation's network, `default_inter_node_link`)."""
    spec = get_hardware(hardware_key)
    link, nics = network(inter or default_inter_node_link(spec.key))
    return Cluster(gpus_per_node=gpus_per_node, intra=get_link(intra or INTRA_NODE_LINK[spec.key]), inter=link,
                   nics_per_node=nics, measured=measured, net_overhead_s=NET_OVERHEAD_S[HOST_CPU.get(spec.key, "other")])


FALLBACK_INTRA_NODE_LINK = "pcie4-x16"
"""The link assumed inside a node for a device with no datasheet row (a CPU, an unknown GPU)."""


def cluster_for(device: str, gpus_per_node: int = 8, inter: str | None = None,
                measured: CollectiveCurves | None = None, intra: str | None = None) -> Cluster:
    """``default_cluster`` for a datasheet device; for any other, ``intra`` or else PCIe Gen4 inside a node,
    said so.

    ``measured``: the device's measured collectives (HardwareProfile.collectives), used inside a node.
    """
    if intra is not None:
        intra_node_link(intra)  # an unknown link is named as such, not taken for an unknown device
    try:
        return default_cluster(device, gpus_per_node, inter, measured, intra)
    except ConfigError:
        link = get_link(intra or FALLBACK_INTRA_NODE_LINK)
        inside = measured is not None and bool(measured.curves)
        assumed = "" if inside or intra else f"{device!r} has no datasheet link: {link.name} assumed inside a node"
        between, nics = network(inter or DEFAULT_INTER_NODE_LINK)
        return Cluster(gpus_per_node=gpus_per_node, intra=link, inter=between, nics_per_node=nics, assumed=assumed,
                       measured=measured)
