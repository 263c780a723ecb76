"""Samples /proc every 0.5 s for SECONDS: every python process seen (xdist workers included), its command line,
first and last time seen and CPU seconds (utime + stime). One JSON line per process into OUT.

    python census.py OUT SECONDS &    # beside a `make test`
"""

import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def sample(seen: dict) -> set:
    now, live = time.time(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if "python" not in cmd or "census.py" in cmd:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        key = (pid, cmd[:300])
        live.add(key)
        record = seen.setdefault(key, {"pid": int(pid), "cmd": cmd[:300], "first": now})
        record.update(last=now, cpu=cpu)
    return live


def main(out_path: str, seconds: float) -> None:
    seen: dict = {}
    stop_at = time.time() + seconds
    with open(out_path, "w") as out:
        while time.time() < stop_at:
            live = sample(seen)
            for key in [k for k in seen if k not in live]:
                out.write(json.dumps(seen.pop(key)) + "\n")
                out.flush()
            time.sleep(0.5)
        for record in seen.values():
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
