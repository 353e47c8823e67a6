#!/usr/bin/env python3
"""A throw-away etcd cluster on loopback for muster's tests (system python3, standard library only).

Commands (D is a directory of the cluster's own; every command but `start` reads D/cluster.json):

    cluster.py start --members N --dir D [--etcd BIN] [--tls] [--owner PID] [--timeout S]
        Starts N members (e1..eN) on free loopback ports, each with its data dir D/eI.data and log D/eI.log,
        waits until every member answers /v3/maintenance/status and agrees on a leader, writes D/cluster.json
        and prints the client endpoints ("127.0.0.1:P1,127.0.0.1:P2,...") on stdout, then exits and leaves
        etcd running. --tls makes a self-signed CA, a server and a client certificate under D/tls/ and serves
        https with --client-cert-auth. --owner PID starts a watchdog that stops the cluster once PID is gone
        (a test process killed before its cleanup leaks no etcd).
    cluster.py leader --dir D            prints the leader's name; exit 1 when no live member claims to lead
    cluster.py kill --dir D --member M   kill -9 of member M (by PID), waits until it is gone
    cluster.py stop-all --dir D          SIGTERM (SIGKILL after 5 s) to every member; ports and data dirs are kept
    cluster.py start-all --dir D         starts every member that is not running, on its old ports and data dir,
                                         and waits until healthy
    cluster.py stop --dir D              kills every member and removes what `start` created (nothing else)

cluster.json: {"etcd", "scheme", "endpoints", "tls": null | {"ca", "cert", "key"}, "watchdog_pid",
               "members": [{"name", "pid" (null when stopped), "client_url", "peer_url", "data_dir", "log"}]}

From a Rust unit test (std::process::Command), a single member is healthy in about a second:

    python3 scripts/etcd/cluster.py start --members 1 --dir D --etcd BIN --owner <std::process::id()>
        -> stdout "127.0.0.1:PORT\\n", exit 0 once healthy (exit 1 with the member's log tail on stderr otherwise)
    python3 scripts/etcd/cluster.py stop --dir D

Exit codes: 0 done, 1 the cluster did not do what was asked (the reason on stderr), 2 bad arguments.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

HEALTH_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0
REQUEST_TIMEOUT_S = 1.0


class ClusterError(Exception):
    """What went wrong, in one line for stderr."""


# ---------------------------------------------------------------- processes


def proc_alive(pid):
    """True while pid runs; a zombie counts as gone (it has exited; its parent may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split(" ", 1)[0] not in ("Z", "X")


def proc_is(pid, needle):
    """True when pid is alive and its command line contains `needle` (so a reused PID is never killed)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return proc_alive(pid) and needle.encode() in args


def wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while any(proc_alive(p) for p in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def signal_member(member, sig):
    pid = member.get("pid")
    if pid and proc_is(pid, member["data_dir"]):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        return pid
    return None


def stop_members(members, first_signal):
    """Signals every running member, SIGKILLs those still alive after the grace, and marks them stopped."""
    pids = [p for p in (signal_member(m, first_signal) for m in members) if p]
    if not wait_gone(pids, STOP_GRACE_S if first_signal != signal.SIGKILL else 0.0):
        for m in members:
            signal_member(m, signal.SIGKILL)
        if not wait_gone(pids, STOP_GRACE_S):
            raise ClusterError(f"etcd pids {pids} survived SIGKILL for {STOP_GRACE_S} s")
    for m in members:
        m["pid"] = None


# ---------------------------------------------------------------- ports and certificates


def free_ports(count):
    """Ports the kernel hands out for bind(0), all held at once so that no two are the same."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {r.stderr.strip()}")


def make_certs(tls_dir):
    """A CA, a server certificate for IP 127.0.0.1 and a client certificate, EC P-256 (fast to make).

    The server certificate carries clientAuth as well: the JSON gateway dials the member's own gRPC port with it,
    and with serverAuth alone it answers 503."""
    os.makedirs(tls_dir)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *key, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "3650",
            "-subj", "/CN=muster-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=tls_dir)
    leaves = [("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
              ("client", "muster-test-client", "extendedKeyUsage=clientAuth\n")]
    for serial, (name, cn, ext) in enumerate(leaves, start=1):
        with open(os.path.join(tls_dir, f"{name}.ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n" + ext)
        openssl("req", *key, "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=tls_dir)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-set_serial", str(serial), "-days", "3650", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
                cwd=tls_dir)
    return {"ca": os.path.join(tls_dir, "ca.pem"), "cert": os.path.join(tls_dir, "client.pem"),
            "key": os.path.join(tls_dir, "client-key.pem"),
            "server_cert": os.path.join(tls_dir, "server.pem"), "server_key": os.path.join(tls_dir, "server-key.pem")}


# ---------------------------------------------------------------- the gateway


def ssl_context(tls):
    if not tls:
        return None
    ctx = ssl.create_default_context(cafile=tls["ca"])
    ctx.load_cert_chain(tls["cert"], tls["key"])
    return ctx


def status(cluster, member):
    """The member's /v3/maintenance/status as a dict, or None when it does not answer in time."""
    req = urllib.request.Request(member["client_url"] + "/v3/maintenance/status", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S, context=ssl_context(cluster["tls"])) as r:
            return json.loads(r.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


def leader_name(cluster):
    """The live member whose own member_id is the leader it reports (int64s are JSON strings), else None."""
    for m in cluster["members"]:
        if not m["pid"]:
            continue
        st = status(cluster, m)
        if st and st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
            return m["name"]
    return None


def wait_healthy(cluster, timeout):
    """Waits until every running member answers status and they all name the same, non-zero leader."""
    deadline = time.monotonic() + timeout
    running = [m for m in cluster["members"] if m["pid"]]
    while True:
        for m in running:
            if not proc_alive(m["pid"]):
                raise ClusterError(f"etcd member {m['name']} exited during start-up:\n{log_tail(m)}")
        # In parallel: a member's gateway holds a request until the member is ready.
        with concurrent.futures.ThreadPoolExecutor(len(running)) as pool:
            leaders = {(st or {}).get("leader") for st in pool.map(lambda m: status(cluster, m), running)}
        if len(leaders) == 1 and None not in leaders and "0" not in leaders:
            return
        if time.monotonic() >= deadline:
            tails = "\n".join(f"--- {m['name']}:\n{log_tail(m)}" for m in running)
            raise ClusterError(f"etcd cluster not healthy within {timeout} s (leaders seen: {leaders}):\n{tails}")
        time.sleep(0.05)


def log_tail(member, lines=15):
    try:
        with open(member["log"], errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------- cluster.json


def state_path(d):
    return os.path.join(d, "cluster.json")


def read_state(path):
    """A state file's JSON; OSError or ValueError when it is missing or torn (the caller says what it is)."""
    with open(path) as f:
        return json.load(f)


def write_state(path, state):
    """Replaces a state file at once (a reader never sees half of it)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path)


def load(d):
    try:
        return read_state(state_path(d))
    except (OSError, ValueError) as e:
        raise ClusterError(f"no cluster in {d}: {e} (run `cluster.py start --dir {d}` first)") from e


def save(d, cluster):
    write_state(state_path(d), cluster)


# ---------------------------------------------------------------- commands


def spawn_member(cluster, m):
    tls = cluster["tls"]
    initial = ",".join(f"{x['name']}={x['peer_url']}" for x in cluster["members"])
    args = [cluster["etcd"], "--name", m["name"], "--data-dir", m["data_dir"],
            "--listen-client-urls", m["client_url"], "--advertise-client-urls", m["client_url"],
            "--listen-peer-urls", m["peer_url"], "--initial-advertise-peer-urls", m["peer_url"],
            "--initial-cluster", initial, "--initial-cluster-token", cluster["token"],
            "--initial-cluster-state", "new", *cluster["raft_flags"]]
    if tls:
        args += ["--cert-file", tls["server_cert"], "--key-file", tls["server_key"], "--client-cert-auth",
                 "--trusted-ca-file", tls["ca"]]
    with open(m["log"], "ab") as log:
        # A session of its own: a test's Ctrl-C or process-group kill does not reach etcd; `stop` and the
        # watchdog do.
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    m["pid"] = p.pid


def new_cluster(args, d):
    scheme = "https" if args.tls else "http"
    tls = make_certs(os.path.join(d, "tls")) if args.tls else None
    ports = free_ports(2 * args.members)
    members = [{"name": f"e{i + 1}", "pid": None,
                "client_url": f"{scheme}://127.0.0.1:{ports[2 * i]}",
                "peer_url": f"http://127.0.0.1:{ports[2 * i + 1]}",
                "data_dir": os.path.join(d, f"e{i + 1}.data"), "log": os.path.join(d, f"e{i + 1}.log")}
               for i in range(args.members)]
    return {"etcd": args.etcd, "scheme": scheme, "tls": tls, "token": f"muster-{os.getpid()}-{time.time_ns()}",
            "endpoints": ",".join(m["client_url"].split("://", 1)[1] for m in members),
            "members": members, "watchdog_pid": None,
            # A lone member has no peer to hear from: a short election timeout makes it leader in ~50 ms, not ~0.7 s.
            "raft_flags": ["--heartbeat-interval", "10", "--election-timeout", "100"] if args.members == 1 else []}


def cmd_start(args):
    d = os.path.abspath(args.dir)
    if os.path.exists(state_path(d)):
        raise ClusterError(f"{state_path(d)} exists: a cluster is already there (`cluster.py stop --dir {d}`)")
    for attempt in range(1, 4):
        try:
            print(start_once(args, d), flush=True)
            return
        except ClusterError as e:
            # Another process may take a free port between our close and etcd's bind: new ports, again.
            if "address already in use" not in str(e) or attempt == 3:
                raise


def start_once(args, d):
    created_dir = not os.path.isdir(d)
    os.makedirs(d, exist_ok=True)
    cluster = new_cluster(args, d)
    cluster["created_dir"] = created_dir
    save(d, cluster)  # first, so that `stop` can clean up whatever happens next
    try:
        for m in cluster["members"]:
            spawn_member(cluster, m)
        save(d, cluster)
        wait_healthy(cluster, args.timeout)
        if args.owner:
            cluster["watchdog_pid"] = spawn_watchdog(d, args.owner)
            save(d, cluster)
    except BaseException:
        stop(d, cluster)
        raise
    return cluster["endpoints"]


def spawn_watchdog(d, owner):
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "watch", "--dir", d, "--owner", str(owner)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    return p.pid


def cmd_watch(args):
    """Stops the cluster once the owner process is gone; ends by itself when the cluster is stopped."""
    d = os.path.abspath(args.dir)
    while os.path.exists(state_path(d)):
        if not proc_alive(args.owner):
            try:
                stop(d, load(d))
            except ClusterError:
                pass
            return
        time.sleep(0.5)


def cmd_leader(args):
    name = leader_name(load(args.dir))
    if name is None:
        raise ClusterError("no live etcd member claims to be the leader (an election may be in progress)")
    print(name)


def cmd_kill(args):
    cluster = load(args.dir)
    member = next((m for m in cluster["members"] if m["name"] == args.member), None)
    if member is None:
        names = ", ".join(m["name"] for m in cluster["members"])
        raise ClusterError(f"--member {args.member}: no such member (members: {names})")
    if not member["pid"] or not proc_alive(member["pid"]):
        raise ClusterError(f"member {args.member} is not running")
    stop_members([member], signal.SIGKILL)
    save(args.dir, cluster)


def cmd_stop_all(args):
    cluster = load(args.dir)
    stop_members(cluster["members"], signal.SIGTERM)
    save(args.dir, cluster)


def cmd_freeze(args):
    """SIGSTOPs every live member (a process stalled on its disk, say): its kernel still accepts connections."""
    for m in load(args.dir)["members"]:
        signal_member(m, signal.SIGSTOP)


def cmd_thaw(args):
    for m in load(args.dir)["members"]:
        signal_member(m, signal.SIGCONT)


def cmd_start_all(args):
    cluster = load(args.dir)
    for m in cluster["members"]:
        if not m["pid"] or not proc_is(m["pid"], m["data_dir"]):
            spawn_member(cluster, m)
    save(args.dir, cluster)
    wait_healthy(cluster, args.timeout)


def stop(d, cluster):
    """Kills every member and the watchdog, then removes what `start` created."""
    stop_members(cluster["members"], signal.SIGKILL)
    wd = cluster.get("watchdog_pid")
    if wd and wd != os.getpid() and proc_is(wd, "watch"):
        os.kill(wd, signal.SIGKILL)
    for m in cluster["members"]:
        subprocess.run(["rm", "-rf", "--", m["data_dir"], m["log"]], check=False)
    if cluster["tls"]:
        subprocess.run(["rm", "-rf", "--", os.path.join(d, "tls")], check=False)
    os.remove(state_path(d))
    if cluster.get("created_dir"):
        try:
            os.rmdir(d)
        except OSError:
            pass  # something else was put there: it is not ours to remove


def cmd_stop(args):
    d = os.path.abspath(args.dir)
    stop(d, load(d))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start")
    start.add_argument("--members", type=int, required=True)
    start.add_argument("--etcd", default="etcd", help="the etcd binary (default: etcd on PATH)")
    start.add_argument("--tls", action="store_true")
    start.add_argument("--owner", type=int, default=None, help="stop the cluster once this PID is gone")
    for name in ("leader", "kill", "stop-all", "start-all", "stop", "watch", "freeze", "thaw"):
        sub.add_parser(name)
    sub.choices["kill"].add_argument("--member", required=True)
    sub.choices["watch"].add_argument("--owner", type=int, required=True)
    for name, sp in sub.choices.items():
        sp.add_argument("--dir", required=True)
        if name in ("start", "start-all"):
            sp.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT_S, help="seconds to wait for health")
    args = p.parse_args(argv)
    if args.cmd == "start":
        if args.members < 1:
            p.error(f"--members must be at least 1, got {args.members}")
        found = args.etcd if os.sep in args.etcd else shutil.which(args.etcd)
        if not found or not os.access(found, os.X_OK):
            p.error(f"--etcd {args.etcd}: not an executable (run `source scripts/lib.sh; ensure_etcd`)")
        args.etcd = os.path.abspath(found)
    return args


COMMANDS = {"start": cmd_start, "leader": cmd_leader, "kill": cmd_kill, "stop-all": cmd_stop_all,
            "start-all": cmd_start_all, "stop": cmd_stop, "watch": cmd_watch, "freeze": cmd_freeze, "thaw": cmd_thaw}


def main(argv):
    args = parse(argv)
    try:
        COMMANDS[args.cmd](args)
    except ClusterError as e:
        print(f"cluster.py {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
