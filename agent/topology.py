"""How a box's GPUs are joined: ``nvidia-smi topo -m``, read into the fingerprint.

The matrix names the path between every pair of GPUs and between GPUs and
NICs: ``NV#`` (a bonded set of # NVLinks), ``PIX`` (one PCIe switch), ``PXB``
(several PCIe switches), ``PHB`` (a PCIe host bridge), ``NODE`` (host bridges
of one NUMA node), ``SYS`` (across NUMA nodes). Collective bandwidth depends
on it, so a collective result is only comparable with another box's when the
topologies match. A box without nvidia-smi records none (absent, not guessed).
"""

from __future__ import annotations

import re
import shutil
import subprocess

_NVLINKS = re.compile(r"NV(\d+)")
_DEVICE = re.compile(r"(GPU|NIC)\d+")


def parse_topology(text: str) -> dict:
    """The matrix as ``{"links": {GPUi: {peer: path}}, "nvlinks_per_gpu": {GPUi: n}, "nics": {NICi: name}}``.

    ``nvlinks_per_gpu`` is the widest NVLink bond a GPU has to any peer (on an
    NVSwitch board every peer shows the GPU's full set, e.g. NV18 on H100 SXM);
    0 where it has none.
    """
    lines = [line.rstrip() for line in text.splitlines()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), None)
    if header is None:
        return {}
    columns = [name for name in header if _DEVICE.fullmatch(name)]
    links: dict[str, dict[str, str]] = {}
    nics: dict[str, str] = {}
    for line in lines:
        cells = line.split()
        if not cells:
            continue
        if _DEVICE.fullmatch(cells[0]) and len(cells) > len(columns) and cells[0].startswith("GPU"):
            links[cells[0]] = {peer: path for peer, path in zip(columns, cells[1:]) if peer != cells[0]}
        named = re.fullmatch(r"(NIC\d+):\s*(\S+)", line.strip())
        if named:
            nics[named.group(1)] = named.group(2)
    nvlinks = {
        gpu: max((int(m.group(1)) for path in peers.values() if (m := _NVLINKS.fullmatch(path))), default=0)
        for gpu, peers in links.items()
    }
    return {"links": links, "nvlinks_per_gpu": nvlinks, "nics": nics}


def read_topology() -> dict:
    """This box's matrix; {} where nvidia-smi is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=10,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_topology(out)
