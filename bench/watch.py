#!/usr/bin/env python3
# watch.py: runs a benchmark command and reports how much CPU time other jobs used meanwhile
# (/proc/stat busy time minus the run's own rusage, children included), as a fraction of
# the wall time; "watch.py idle" prints the busy percentage of all CPUs over one second.
# Usage: watch.py idle | watch.py OUT CMD...   (CMD's stdout goes to OUT; exit status is CMD's)
import os, subprocess, sys, time
def busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4]  # user nice system irq softirq steal (not idle, iowait)
hz = os.sysconf("SC_CLK_TCK")
if sys.argv[1] == "idle":  # print the busy percentage of all CPUs over one second
    b0, t0 = busy(), time.time(); time.sleep(1)
    print(int(100 * (busy() - b0) / hz / (time.time() - t0) / os.cpu_count()))
    sys.exit(0)
b0, t0 = busy(), time.time()
with open(sys.argv[1], "w") as out:
    p = subprocess.Popen(sys.argv[2:], stdout=out, stdin=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
wall = time.time() - t0
foreign = max(0.0, (busy() - b0) / hz - ru.ru_utime - ru.ru_stime)
print(f"{foreign / wall:.3f}")
sys.exit(os.waitstatus_to_exitcode(status))
