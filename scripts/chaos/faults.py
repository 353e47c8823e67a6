"""The injected events: each picks its target with the run's seeded random, does its damage, and says
whether every node is expected to re-form afterwards (so the driver knows what "recovered" means)."""

import os
import signal
import socket
import time

from cluster import wait_until

KINDS = ["kill_worker", "kill_agent", "stop_short", "stop_long", "xid79", "xid13", "fill_port", "restart_store"]
# Drawn only when named with --only (the default schedule of each seed stays as it was).
EXTRA_KINDS = ["store_mid_reform"]
FILL_CONNECTIONS = (200, 400)


class Faults:
    def __init__(self, cluster, rng, log):
        self.c, self.rng, self.log = cluster, rng, log
        self.idle = []  # idle connections held open across the next event

    def inject(self, kind):
        """Runs one event; returns (target node or None, detail, whether all nodes should re-form)."""
        return getattr(self, kind)()

    def _node(self):
        return self.rng.choice(sorted(self.c.agents))

    def kill_worker(self):
        node = self._node()
        workers = self.c.agents[node].workers()
        pid = self.rng.choice(sorted(workers))
        os.kill(pid, signal.SIGKILL)
        return node, f"SIGKILL worker pid {pid}", True

    def kill_agent(self):
        node = self._node()
        agent = self.c.agents[node]
        agent.proc.kill()
        agent.proc.wait()
        self.c.reap()
        time.sleep(self.rng.uniform(0, 2))  # a replacement arrives a moment later, as a scheduler's would
        new = self.c.start_agent(node)
        return node, f"SIGKILL agent pid {agent.proc.pid}; replacement {new.name} pid {new.proc.pid}", True

    def _stop(self, factor):
        node = self._node()
        agent = self.c.agents[node]
        secs = round(self.c.liveness_s * self.rng.uniform(*factor), 2)
        agent.proc.send_signal(signal.SIGSTOP)
        agent.stopped = True
        time.sleep(secs)
        agent.proc.send_signal(signal.SIGCONT)
        agent.stopped = False
        return node, f"SIGSTOP agent pid {agent.proc.pid} for {secs} s (liveness deadline {self.c.liveness_s} s)"

    def stop_short(self):
        node, detail = self._stop((0.2, 0.5))
        return node, detail, False

    def stop_long(self):
        node, detail = self._stop((1.5, 2.5))
        return node, detail, True

    def _xid(self, line):
        node = self._node()
        agent = self.c.agents[node]
        gpu = self.rng.randrange(self.c.a.nproc)
        if not wait_until(30, lambda: agent.registered(gpu)):
            raise RuntimeError(f"{agent.name}: GPU {gpu} never registered for events (see {agent.nvml_status})")
        agent.inject(line.format(gpu=gpu))
        return node, agent, gpu

    def xid79(self):
        """The GPU falls off the bus (its worker dies 30 ms later): the node drains (exit 75) and a
        replacement node with healthy GPUs takes its place."""
        node, agent, gpu = self._xid("lost {gpu} kill=+30")
        code = wait_until(60, lambda: agent.proc.poll() is not None and agent.proc.returncode + 1000)
        if not code:
            raise RuntimeError(f"{agent.name} did not drain within 60 s of XID 79 on GPU {gpu}")
        self.c.reap()
        new = self.c.start_agent(node)
        return node, f"XID 79 on GPU {gpu}; {agent.name} exit {agent.exit_code}; replacement {new.name}", True

    def xid13(self):
        node, agent, gpu = self._xid("xid {gpu} 13 kill=+5")
        return node, f"XID 13 on GPU {gpu} (its worker killed 5 ms later)", True

    def fill_port(self):
        n = self.rng.randint(*FILL_CONNECTIONS)
        for _ in range(n):
            try:
                self.idle.append(socket.create_connection(("127.0.0.1", self.c.store.port), timeout=2))
            except OSError as e:
                self.log("fill", f"connection {len(self.idle)} refused: {e}")
                break
        return None, f"{len(self.idle)} idle connections to the rendezvous port (closed after the next event)", False

    def close_idle(self):
        if self.idle:
            self.log("fill", f"closing {len(self.idle)} idle connections")
        for s in self.idle:
            s.close()
        self.idle = []

    def store_mid_reform(self):
        """A worker dies and, while the group stops and re-forms (agents opening the next round, joining it,
        waiting for group rank 0), the store restarts under them: they re-form in the new store."""
        node = self._node()
        pid = self.rng.choice(sorted(self.c.agents[node].workers()))
        os.kill(pid, signal.SIGKILL)
        reforming = ("stopping", "restarting", "rendezvous")
        if not wait_until(10, lambda: any(p in reforming for p, _ in self.c.state().values()), poll=0.01):
            raise RuntimeError(f"no agent began to re-form within 10 s of SIGKILL of worker {pid} on {node}")
        # SIGKILL (a crash): a SIGTERMed store would take a moment to exit and miss the re-formation.
        self.c.store.proc.kill()
        self.c.store.proc.wait()
        time.sleep(self.rng.uniform(0, 1.5))
        self.c.store.start()
        return node, f"SIGKILL worker pid {pid}; the store restarted while the group re-formed", True

    def restart_store(self):
        self.c.store.stop()
        code = self.c.store.proc.returncode
        time.sleep(self.rng.uniform(0, 1))
        self.c.store.start()
        return None, f"muster store SIGTERM (exit {code}) and started again on port {self.c.store.port}", False
