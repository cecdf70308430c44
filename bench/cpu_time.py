"""CPU time of a cluster's daemons and of the consumers a bench ran, for the
benches that compare CPU time per batch (request_window.py, client_vs.py)."""
import os
import resource

TICK = os.sysconf('SC_CLK_TCK')


def cluster_cpu_seconds(pids):
    """(CPU seconds of the daemons pids, all their threads, and of the child
    processes run and waited for so far; of those children alone)."""
    total = 0.0
    for pid in pids:
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / TICK
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = r.ru_utime + r.ru_stime
    return total + children, children
