#!/usr/bin/env python3
"""make test's check of `gpuarr-info --watch 0.1 --count 2 --json`: every line is a JSON object,
one per device (as `gpuarr-info --json` lists them) per tick, for ticks 1 and 2, each with the
readings' keys, null exactly where its valid list leaves a reading out.

usage: tools/check-watch-json.py path/to/gpuarr-info"""
import json
import subprocess
import sys

# the valid bit each key depends on
KEYS = {"memory_total": "memory_total", "memory_used": "memory_usage", "memory_free": "memory_usage",
        "gpu_utilization_pct": "gpu_utilization", "memory_utilization_pct": "memory_utilization",
        "temperature_c": "temperature", "power_w": "power", "power_limit_w": "power_limit",
        "sm_clock_mhz": "sm_clock", "memory_clock_mhz": "memory_clock", "throttle_reasons": "throttle_reasons",
        "pcie_generation": "pcie_generation", "pcie_width": "pcie_width"}


def main():
    tool = sys.argv[1]
    devices = [d["spec"] for d in json.loads(subprocess.check_output([tool, "--json"]))["devices"]]
    out = subprocess.check_output([tool, "--watch", "0.1", "--count", "2", "--json"], text=True)
    lines = out.splitlines()
    seen = []
    for n, line in enumerate(lines, 1):
        obj = json.loads(line)
        if not isinstance(obj, dict):
            sys.exit(f"line {n} is not an object: {line}")
        for key, bit in KEYS.items():
            if (obj[key] is None) == (bit in obj["valid"]):
                sys.exit(f"line {n}: {key} is {obj[key]} but valid is {obj['valid']}")
        if obj["memory_total"] is None or obj["memory_total"] <= 0:
            sys.exit(f"line {n}: no total memory: {line}")
        if not isinstance(obj["pool_allocated_bytes"], int) or not isinstance(obj["pool_reserved_bytes"], int):
            sys.exit(f"line {n}: no pool figures: {line}")
        seen.append((obj["tick"], obj["spec"]))
    want = [(tick, spec) for tick in (1, 2) for spec in devices]
    if seen != want:
        sys.exit(f"ticks and devices {seen}, expected {want}")
    print(f"   {len(lines)} JSON lines: {len(devices)} devices ({', '.join(devices)}) x 2 ticks")


main()
