"""Slurm's compressed host lists, read and written as Slurm does ("gpu-[001-003,005]").

    expand_hostlist("gpu-[001-002,004],login1")   # ["gpu-001", "gpu-002", "gpu-004", "login1"]
    compress_hostlist(["gpu-001", "gpu-002", "gpu-004"])   # "gpu-[001-002,004]"
"""

import re

_HOSTLIST_ITEM = re.compile(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)")


def expand_hostlist(text):
    """Slurm's compressed host list as names: "gpu-[001-002,004],login1" ->
    gpu-001, gpu-002, gpu-004, login1 (zero padding kept)."""
    names = []
    position = 0
    while position < len(text):
        match = _HOSTLIST_ITEM.match(text, position)
        if match is None:
            raise ValueError(f"cannot read the host list {text!r}")
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            names.append(prefix + suffix)
        else:
            for item in ranges.split(","):
                low, _, high = item.partition("-")
                if not all(part.isascii() and part.isdigit() for part in (low, high or low)):
                    raise ValueError(f"cannot read the host list {text!r}")
                width = len(low)
                for number in range(int(low), int(high or low) + 1):
                    names.append(f"{prefix}{number:0{width}d}{suffix}")
        position = match.end() + 1  # past the comma
    return names


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names):
    """The names as one host list: names that differ only in a trailing number of one width
    share brackets, with runs as ranges; the others stay as they are. Order: by prefix, then
    number, as `scontrol show hostlist` sorts."""
    groups, plain = {}, []
    for name in names:
        match = _NUMBERED.match(name)
        if match is None:
            plain.append(name)
            continue
        prefix, digits = match.groups()
        groups.setdefault((prefix, len(digits)), []).append(int(digits))
    parts = []
    for (prefix, width), numbers in sorted(groups.items()):
        runs = []  # [first, last] of each run of consecutive numbers
        for number in sorted(set(numbers)):
            if runs and number == runs[-1][1] + 1:
                runs[-1][1] = number
            else:
                runs.append([number, number])
        ranges = ",".join(f"{first:0{width}d}" if first == last
                          else f"{first:0{width}d}-{last:0{width}d}" for first, last in runs)
        parts.append(f"{prefix}{ranges}" if len(runs) == 1 and runs[0][0] == runs[0][1]
                     else f"{prefix}[{ranges}]")
    return ",".join(parts + plain)
