"""The processes of one chaos run: the external `muster store`, four muster agents (each node's fake GPUs,
log directory and JSON event log per incarnation), and a /proc view of everything they started.

Every process of the run carries MUSTER_CHAOS_RUN=<run id> in its environment (children inherit it), so
"nothing of the run is left" is a scan of /proc for that marker, whatever re-parented or setsid'd itself.
"""

import json
import os
import signal
import socket
import subprocess
import time
from datetime import datetime

MARKER = "MUSTER_CHAOS_RUN"


def now():
    return time.time()


def parse_ts(ts):
    """An agent event's RFC 3339 timestamp as seconds since the epoch."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def wait_until(deadline_s, pred, poll=0.1):
    """Polls `pred` until it is truthy or `deadline_s` passes; returns its last value."""
    end = now() + deadline_s
    while True:
        v = pred()
        if v or now() >= end:
            return v
        time.sleep(poll)


def marked_pids(run_id):
    """Every live process whose environment carries this run's marker."""
    needle = f"{MARKER}={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(entry))
    return found


def children(pid):
    """Direct children of `pid` (from /proc/<pid>/task/*/children)."""
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Store:
    """The external `muster store` on a fixed loopback port (restarted on the same one)."""

    def __init__(self, muster, run_dir, env, log):
        self.muster, self.run_dir, self.env, self.log = muster, run_dir, env, log
        self.port, self.proc, self.starts = None, None, 0

    def start(self):
        port = self.port or free_port()
        out = open(os.path.join(self.run_dir, f"store.{self.starts}.log"), "w")
        for _ in range(50):  # the old listener's port may take a moment to be free again
            self.proc = subprocess.Popen([self.muster, "store", "--host", "127.0.0.1", "--port", str(port)],
                                         stdout=out, stderr=subprocess.STDOUT, env=self.env)
            ready = wait_until(10, lambda: self.proc.poll() is not None or self._listening(port))
            if ready and self.proc.poll() is None:
                self.port = port
                self.starts += 1
                self.log("store", f"muster store pid {self.proc.pid} on 127.0.0.1:{port}")
                return
            time.sleep(0.2)
        raise RuntimeError(f"muster store would not start on port {port}; see {out.name}")

    @staticmethod
    def _listening(port):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self):
        """SIGTERM, then wait for it to exit (SIGKILL after 10 s: that would be a finding)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "killed after 10 s"


class Agent:
    """One incarnation of a node's agent: its process, event log and fake NVML files."""

    def __init__(self, node, incarnation, run_dir):
        self.node, self.incarnation = node, incarnation
        self.name = f"{node}.{incarnation}"
        base = os.path.join(run_dir, self.name)
        os.makedirs(base, exist_ok=True)
        self.events_log = os.path.join(base, "events.jsonl")  # the agent's stderr: JSON events and logs
        self.stdout = os.path.join(base, "stdout")
        self.log_dir = os.path.join(base, "logs")
        self.nvml_events = os.path.join(base, "nvml-events")
        self.nvml_status = os.path.join(base, "nvml-status")
        self.proc = None
        self.exit_code = None
        self.stopped = False  # SIGSTOPped now

    def transitions(self):
        """Every transition event so far, in order."""
        out = []
        try:
            with open(self.events_log, errors="replace") as f:
                for line in f:
                    if not line.startswith("{"):
                        continue
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if e.get("name") == "muster.agent.transition":
                        e["t"] = parse_ts(e["timestamp"])
                        out.append(e)
        except OSError:
            pass
        return out

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def workers(self):
        """The agent's live worker processes (its train.py children)."""
        if not self.alive():
            return []
        # The orphan guard is a fork of the agent with the agent's argv (train.py included): not a worker.
        return [p for p in children(self.proc.pid) if "python" in cmdline(p).split(" ")[0] and "train.py" in cmdline(p)]

    def registered(self, gpu):
        try:
            with open(self.nvml_status) as f:
                return f"registered {gpu} " in f.read()
        except OSError:
            return False

    def inject(self, line):
        with open(self.nvml_events, "a") as f:
            f.write(line + "\n")


class Cluster:
    """The store and the agents of one run; everything it starts carries the run's marker."""

    def __init__(self, a, run_dir, log):
        self.a, self.run_dir, self.log = a, run_dir, log
        self.run_id = f"chaos{os.getpid()}s{a.seed}"
        self.env = dict(os.environ, **{MARKER: self.run_id})
        self.store = Store(a.muster, run_dir, self.env, log)
        self.agents = {}  # node -> current Agent
        self.history = []  # every Agent incarnation ever started
        self.ckpt_dir = os.path.join(run_dir, "ckpt")
        self.hold_file = os.path.join(run_dir, "hold")
        self.liveness_s = a.keep_alive_interval * a.keep_alive_max_attempt
        open(self.hold_file, "w").close()

    def nvml_config(self, agent):
        gpus = [{"uuid": f"GPU-{agent.node}{agent.incarnation:03d}{i:04d}-0000-0000-0000-000000000000",
                 "pci_bus_id": f"00000000:{0x18 + i * 0x10:02x}:00.0", "numa_node": 0, "cpu_affinity": [0, 1],
                 "supported_events": ["xid", "dbe", "sbe"]} for i in range(self.a.nproc)]
        topology = [["X" if i == j else "NV18" for j in range(self.a.nproc)] for i in range(self.a.nproc)]
        path = os.path.join(self.run_dir, agent.name, "nvml.json")
        with open(path, "w") as f:
            json.dump({"gpus": gpus, "topology": topology, "attach_processes": True}, f)
        open(agent.nvml_events, "w").close()
        return path

    def agent_argv(self, agent):
        a = self.a
        conf = (f"is_host=0,last_call_timeout={a.last_call_timeout},keep_alive_interval={a.keep_alive_interval},"
                f"keep_alive_max_attempt={a.keep_alive_max_attempt}")
        return [a.muster, f"--nnodes={a.nnodes}", f"--nproc-per-node={a.nproc}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{self.store.port}", f"--rdzv-conf={conf}", f"--rdzv-id={self.run_id}",
                f"--max-restarts={a.max_restarts}", "--event-log-handler=console", f"--log-dir={agent.log_dir}",
                "--shutdown-timeout=5", a.train, f"--steps={a.steps}", f"--ckpt-dir={self.ckpt_dir}",
                f"--ckpt-every={a.ckpt_every}", f"--step-sleep={a.step_sleep}", f"--hold-file={self.hold_file}"]

    def start_agent(self, node):
        incarnation = sum(1 for x in self.history if x.node == node)
        agent = Agent(node, incarnation, self.run_dir)
        env = dict(self.env, MUSTER_NVML_LIBRARY=self.a.fake_nvml, FAKE_NVML_CONFIG=self.nvml_config(agent),
                   FAKE_NVML_EVENTS_FILE=agent.nvml_events, FAKE_NVML_STATUS_FILE=agent.nvml_status)
        with open(agent.stdout, "w") as out, open(agent.events_log, "w") as err:
            agent.proc = subprocess.Popen(self.agent_argv(agent), stdout=out, stderr=err, env=env)
        self.agents[node] = agent
        self.history.append(agent)
        self.log("agent", f"started {agent.name} pid {agent.proc.pid}")
        return agent

    def reap(self):
        """Records the exit codes of agents that ended."""
        for agent in self.history:
            if agent.exit_code is None and agent.proc.poll() is not None:
                agent.exit_code = agent.proc.returncode

    def state(self):
        """node -> (last phase, time of the last transition) of each current incarnation."""
        out = {}
        for node, agent in self.agents.items():
            ts = agent.transitions()
            out[node] = (ts[-1]["to"], ts[-1]["t"]) if ts else ("init", 0.0)
        return out

    def settled(self, since, changed, settle_s):
        """Every current agent is alive and running, none changed for `settle_s`, and (when `changed`) each
        entered running after `since`. Returns None when not yet, else the time they settled."""
        self.reap()
        st = self.state()
        dead = {a.name: a.exit_code for a in self.agents.values() if not a.alive()}
        if dead:
            raise RuntimeError(f"agents ended unexpectedly (exit codes {dead}); states {st}")
        if any(not self.agents[n].alive() for n in st) or any(p != "running" for p, _ in st.values()):
            return None
        last = max(t for _, t in st.values())
        if changed and min(t for _, t in st.values()) < since:
            return None
        if now() - last < settle_s or any(len(self.agents[n].workers()) < self.a.nproc for n in st):
            return None
        return last

    def kill_all(self):
        """SIGCONT then SIGKILL everything of the run (every exit path of the driver)."""
        for _ in range(5):
            pids = marked_pids(self.run_id)
            if not pids:
                return
            for pid in pids:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            time.sleep(0.2)
        for agent in self.history:
            if agent.proc.poll() is None:
                agent.proc.kill()
        if self.store.proc and self.store.proc.poll() is None:
            self.store.proc.kill()
