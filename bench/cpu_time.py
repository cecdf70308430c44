"""CPU time of a cluster's daemons and of the consumers a bench ran, for the
benches that compare CPU time (dynamic_vs_off.py, request_window.py,
client_vs.py), and how busy the whole machine was."""
import os
import resource

TICK = os.sysconf('SC_CLK_TCK')


def _daemons(pids):
    """(user, system) seconds of the daemons pids, all their threads (also those gone)."""
    user = system = 0.0
    for pid in pids:
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
        user += int(fields[11]) / TICK
        system += int(fields[12]) / TICK
    return user, system


def process_cpu_seconds(pid):
    """CPU seconds (user and system) of the daemon pid, all its threads (also those gone),
    in clock ticks: sum it over many runs before dividing."""
    user, system = _daemons([pid])
    return user + system


def threads_cpu_seconds(pid):
    """CPU seconds of the live threads of pid, to the nanosecond (the scheduler's
    run time, /proc/PID/task/TID/schedstat): for a daemon whose threads outlive
    the runs measured (the dispatcher's loop), whose CPU a run is too small for
    clock ticks (10 ms). Threads that ended are not counted."""
    total = 0
    base = '/proc/%d/task' % pid
    for tid in os.listdir(base):
        try:
            with open('%s/%s/schedstat' % (base, tid)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9


def children_cpu_seconds():
    """CPU seconds of the child processes run and waited for so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_user_system(pids):
    """(user, system) CPU seconds of the daemons pids and of the child
    processes run and waited for so far."""
    user, system = _daemons(pids)
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return user + r.ru_utime, system + r.ru_stime


def cluster_cpu_seconds(pids):
    """(CPU seconds of the daemons pids, all their threads, and of the child
    processes run and waited for so far; of those children alone)."""
    user, system = _daemons(pids)
    children = children_cpu_seconds()
    return user + system + children, children


def machine_ticks():
    """(idle, all) clock ticks of every CPU of the machine so far (/proc/stat:
    idle and iowait count as idle): two readings give the share of the
    machine that was busy between them, whoever used it."""
    with open('/proc/stat') as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def busy_share(before, after):
    """The share of the machine busy between two machine_ticks() readings (0 when no tick passed)."""
    idle, total = after[0] - before[0], after[1] - before[1]
    return 1 - idle / total if total > 0 else 0.0
