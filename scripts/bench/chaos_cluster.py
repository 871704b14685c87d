"""Namespace hosts and the processes on them, for scripts/bench/chaos.sh.

`Cluster` wraps scripts/netns.sh (hosts PREFIX-0..N-1 at 10.231.0.(i+1), a bridge in PREFIX-hub)
and cuts a host off by taking its switch port (vI in the hub) down. Processes are found and killed
by PID only: a process belongs to the driver when its /proc/PID/environ holds CHAOS_TAG=<tag>
(every agent gets it, and drun passes it to its workers). Every call has a timeout.
"""
import os
import signal
import subprocess
import time

PORT = 29400


class Cluster:
    def __init__(self, netns_script, prefix, hosts):
        self.script = netns_script
        self.prefix = prefix
        self.hosts = hosts
        self.is_up = False

    def _netns(self, *words, check=True):
        return subprocess.run([self.script, "-p", self.prefix, *words], check=check,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    def up(self):
        self._netns("down", check=False)
        self.is_up = True   # before: an interrupted `up` leaves namespaces for down() to remove
        self._netns("up", str(self.hosts))

    def down(self):
        if self.is_up:
            self._netns("down", check=False)
            self.is_up = False

    @staticmethod
    def addr(host):
        return f"10.231.0.{host + 1}"

    def exec_argv(self, host, argv):
        # netns.sh execs `ip netns exec`, which execs argv: the child's PID is the program's.
        return [self.script, "-p", self.prefix, "exec", str(host), *argv]

    def set_link(self, host, up):
        subprocess.run(["ip", "-n", f"{self.prefix}-hub", "link", "set", f"v{host}",
                        "up" if up else "down"], check=True, capture_output=True, timeout=10)

    def restore_links(self):
        for host in range(self.hosts):
            try:
                self.set_link(host, True)
            except (subprocess.SubprocessError, OSError):
                pass


def environ_has(pid, entry):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def tagged_pids(tag):
    """Live (not zombie) processes carrying CHAOS_TAG=tag."""
    entry = f"CHAOS_TAG={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and environ_has(name, entry) and not is_zombie(int(name)):
            found.append(int(name))
    return found


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] in "ZX"
    except (OSError, ValueError, IndexError):
        return True


def describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"pid {pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return f"pid {pid}: (gone)"


def signal_pid(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def kill_tagged(tag, keep=()):
    """SIGCONT + SIGKILL to every process of the tag except `keep`; waits (bounded) until gone."""
    deadline = time.time() + 5
    while time.time() < deadline:
        pids = [p for p in tagged_pids(tag) if p not in keep]
        if not pids:
            return
        for pid in pids:
            signal_pid(pid, signal.SIGCONT)
            signal_pid(pid, signal.SIGKILL)
        time.sleep(0.05)


def listening(pid, port):
    """Whether the network namespace of `pid` has a TCP socket listening on `port`."""
    try:
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return False
    for row in rows:
        cols = row.split()
        if len(cols) > 3 and cols[3] == "0A" and int(cols[1].split(":")[1], 16) == port:
            return True
    return False


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


class EtcdMembers:
    """A 3-member etcd cluster on namespace hosts of `cluster` (scripts/etcd/up.sh with
    MEMBER_NETNS / MEMBER_ADDRS), for chaos.sh --store etcd: made once per run, owned by this
    process (up.sh's OWNER_PID stops it if the driver dies without down())."""

    BASE_PORT = 2379

    def __init__(self, etcd_dir, cluster, hosts, directory):
        self.scripts = etcd_dir
        self.dir = directory
        self.endpoints = ""
        env = dict(os.environ, BASE_PORT=str(self.BASE_PORT), OWNER_PID=str(os.getpid()),
                   MEMBER_NETNS=" ".join(f"{cluster.prefix}-{h}" for h in hosts),
                   MEMBER_ADDRS=" ".join(cluster.addr(h) for h in hosts))
        out = subprocess.run([os.path.join(etcd_dir, "up.sh"), directory], env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/etcd/up.sh failed ({out.returncode}): "
                               f"{(out.stderr or out.stdout).strip()[-400:]}")
        self.endpoints = out.stdout.split()[-1]

    def member_pid(self, i):
        try:
            with open(os.path.join(self.dir, f"m{i}.pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def down(self):
        for i in range(3):  # a member frozen by a fault that was never undone
            pid = self.member_pid(i)
            if pid:
                signal_pid(pid, signal.SIGCONT)
        subprocess.run([os.path.join(self.scripts, "down.sh"), self.dir], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30)
