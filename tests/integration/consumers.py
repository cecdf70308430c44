"""sluice-cat consumers of one coordinated job (--num-consumers), each read
on a thread of its own until stopped, for jobs that have no end."""
import json
import subprocess
import threading

from harness import child_env


class Consumers:
    """One sluice-cat per window in windows (its --max-outstanding; None: the
    default, a window sized by bytes), consumer
    i of len(windows), of the job job_name over spec, with --with-worker and
    the extra arguments. got[i] is what consumer i printed so far, one
    parsed JSON object per batch (sluice-cat's output comes in blocks: it
    may be ahead of what got holds)."""

    def __init__(self, cluster, spec, job_name, windows, extra=()):
        self.procs, self.readers, self.got = [], [], [[] for _ in windows]
        for i, w in enumerate(windows):
            window = ['--max-outstanding', str(w)] if w is not None else []
            argv = cluster.cat_argv(spec, ['--job-name', job_name, '--num-consumers', str(len(windows)),
                                           '--consumer-index', str(i), '--with-worker'] + window + list(extra))
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                               env=child_env()))
            self.readers.append(threading.Thread(target=self._read, args=(self.procs[-1], self.got[i]), daemon=True))
            self.readers[-1].start()

    @staticmethod
    def _read(proc, out):
        for line in proc.stdout:
            if line.endswith('\n'):  # not the last one's half, cut by the stop
                out.append(json.loads(line))

    def reading(self, upto, where=''):
        """Whether every consumer printed upto batches; an AssertionError
        with what they said if any ended (the job has no end)."""
        ended = [(i, p.returncode) for i, p in enumerate(self.procs) if p.poll() is not None]
        if ended:
            raise AssertionError('%sconsumers %s ended: %s' % (where + ': ' if where else '', ended, ' | '.join(
                self.procs[i].stderr.read()[-1500:] for i, _ in ended)))
        return min(len(g) for g in self.got) >= upto

    def stop(self):
        """Kills them (SIGKILL, which a stopped one gets too) and returns what each said on stderr."""
        for p in self.procs:
            p.kill()
            p.wait()
        for t in self.readers:
            t.join(30)
        return [p.stderr.read() for p in self.procs]
