"""The fleet on paper: N hosts pulling one large release, straight from the bucket or through
rack mirrors (``registry serve --mirror-cache``). Prints the numbers docs/fleet.md quotes.

A fluid model, file by file: every link shares its bandwidth fairly among the transfers
crossing it; a mirror fetches each file from the bucket once (the first request), verifies
it, then serves it to its rack (the mirror in this package sends a file only once it is
verified in full, so a rack waits for the mirror's copy of each file); a host pulls files
one after another with ranged GETs of ``--range-mib`` (what the bucket bills as requests).

Usage: ``python bench/fleet_sim.py [--hosts 1000] [--rack 40] [--release-gb 140] ...``.
All sizes are decimal GB (1e9 bytes), bandwidths Gbit/s, prices USD.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Fleet:
    hosts: int = 1000
    rack: int = 40                 # hosts behind one mirror
    release_gb: float = 140.0
    shard_gb: float = 5.0          # weights shards; the rest is small files
    range_mib: int = 64            # bytes per ranged GET
    host_gbps: float = 25.0        # each host's NIC
    mirror_gbps: float = 100.0     # each mirror's NIC (in and out share it: full duplex)
    bucket_gbps: float = 400.0     # what the bucket/endpoint gives all readers together
    egress_usd_gb: float = 0.09    # internet/cross-region egress per GB
    get_usd_1000: float = 0.0004   # per 1,000 GET requests

    @property
    def mirrors(self) -> int:
        return math.ceil(self.hosts / self.rack)

    @property
    def files(self) -> list[float]:
        n = int(self.release_gb // self.shard_gb)
        rest = self.release_gb - n * self.shard_gb
        return [self.shard_gb] * n + ([rest] if rest > 1e-9 else [])

    def gets(self, readers: int) -> int:
        per = sum(math.ceil(f * 1e9 / (self.range_mib * 2 ** 20)) for f in self.files)
        return readers * (per + 3)  # + manifest, signature, model info


def _gbps_to_gb_s(gbps: float) -> float:
    return gbps / 8.0


def direct(f: Fleet) -> dict[str, float]:
    """Every host reads every byte from the bucket."""
    per_host = min(_gbps_to_gb_s(f.host_gbps), _gbps_to_gb_s(f.bucket_gbps) / f.hosts)
    seconds = f.release_gb / per_host
    return {"bucket_gb": f.hosts * f.release_gb, "gets": f.gets(f.hosts), "seconds": seconds}


def mirrored(f: Fleet) -> dict[str, float]:
    """Each mirror reads every byte once; its rack reads from it, file by file.

    Mirror ingress per file: the bucket's share (bucket / mirrors) capped by the mirror NIC.
    Fan-out per file: the rack shares the mirror NIC, each host capped by its own NIC. A file's
    fan-out starts when it is verified in the mirror and when the rack finished the previous
    one; the mirror fetches the next file meanwhile (ingress and egress are separate
    directions of the NIC)."""
    ingress = min(_gbps_to_gb_s(f.mirror_gbps), _gbps_to_gb_s(f.bucket_gbps) / f.mirrors)
    hosts_here = min(f.rack, f.hosts)
    egress = min(_gbps_to_gb_s(f.host_gbps), _gbps_to_gb_s(f.mirror_gbps) / hosts_here)
    fetched = served = 0.0
    first_byte = None
    for size in f.files:
        fetched += size / ingress            # in the mirror, verified
        start = max(fetched, served)
        first_byte = start if first_byte is None else first_byte
        served = start + size / egress
    return {"bucket_gb": f.mirrors * f.release_gb, "gets": f.gets(f.mirrors),
            "seconds": served, "first_file_s": first_byte or 0.0}


def report(f: Fleet) -> str:
    d, m = direct(f), mirrored(f)
    rows = [("bucket egress (GB)", d["bucket_gb"], m["bucket_gb"]),
            ("bucket GET requests", d["gets"], m["gets"]),
            ("egress cost (USD)", d["bucket_gb"] * f.egress_usd_gb,
             m["bucket_gb"] * f.egress_usd_gb),
            ("request cost (USD)", d["gets"] / 1000 * f.get_usd_1000,
             m["gets"] / 1000 * f.get_usd_1000),
            ("wall time, last host (min)", d["seconds"] / 60, m["seconds"] / 60)]
    out = [f"{f.hosts} hosts, {f.release_gb:g} GB release ({len(f.files)} files), "
           f"{f.mirrors} mirrors of {f.rack} hosts; host {f.host_gbps:g} Gb/s, mirror "
           f"{f.mirror_gbps:g} Gb/s, bucket {f.bucket_gbps:g} Gb/s in all",
           "", "| | straight from the bucket | through rack mirrors |", "|---|---:|---:|"]
    for name, a, b in rows:
        fmt = "{:,.0f}" if max(a, b) >= 100 else "{:,.2f}"
        out.append(f"| {name} | {fmt.format(a)} | {fmt.format(b)} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in Fleet().__dict__.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = ap.parse_args()
    print(report(Fleet(**vars(args))))


if __name__ == "__main__":
    main()
