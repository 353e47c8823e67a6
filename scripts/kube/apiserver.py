#!/usr/bin/env python3
"""A throw-away Kubernetes API server for muster's tests and benchmarks (system python3, standard library).

Commands (D is a directory of its own; every command but `start` reads D/apiserver.json):

    apiserver.py start --dir D --apiserver BIN --etcd BIN [--bind ADDR] [--owner PID] [--timeout S]
        Starts one etcd member (scripts/etcd/cluster.py, under D/etcd) and kube-apiserver in front of it on a
        free port of ADDR (default 127.0.0.1), with an ECDSA service-account key and three users by static
        token: admin (system:masters), agent (the service account default/muster, which rbac.yaml binds) and
        nobody (no role).
        Waits until /readyz answers ok, writes a kubeconfig per user (D/kubeconfig-<user>, namespace
        `default`, the server's own self-signed certificate as the CA) and prints D/apiserver.json's content
        on stdout: {"url", "port", "kubeconfig": {user: path}, "etcd_endpoint", "pid", ...}. --owner PID:
        a watchdog stops everything once PID is gone.
    apiserver.py grant --dir D --manifest F   creates each object of F (YAML documents: ServiceAccount, Role,
                                     RoleBinding, Pod, in namespace default) as admin: packaging/k8s/rbac.yaml as
                                     shipped, or a pod that a Job owns (no node runs it: it only stands there)
    apiserver.py restart --dir D     kill -9 of kube-apiserver, started again on the same port and etcd, ready
    apiserver.py stop --dir D        kills kube-apiserver, etcd and the watchdog; removes what `start` made
    apiserver.py keys --dir D [--owners]   the rendezvous key of every muster Lease in namespace default, one a
                                     line; --owners: each followed by a tab and its owners (Kind/name, comma
                                     separated; - for none)

kube-apiserver on a loopback advertise address needs --endpoint-reconciler-type=none (the reconciler
refuses 127.0.0.1 as the `kubernetes` service's endpoint and the server never becomes ready).

Exit codes: 0 done, 1 the server did not do what was asked (the reason on stderr), 2 bad arguments.
"""

import argparse
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "etcd"))
import cluster  # noqa: E402  (scripts/etcd/cluster.py: processes, ports, the etcd member)

READY_TIMEOUT_S = 60.0
# user -> (name the server knows it by, groups)
USERS = {
    "admin": ("admin", "system:masters"),
    # What a pod of service account default/muster authenticates as, so the shipped RoleBinding applies.
    "agent": ("system:serviceaccount:default:muster", "system:serviceaccounts,system:serviceaccounts:default"),
    "nobody": ("nobody", ""),
}
# Where each kind of packaging/k8s/rbac.yaml is created (namespace default).
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/default/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
    "Pod": "/api/v1/namespaces/default/pods",
}


class ServerError(Exception):
    """What went wrong, in one line for stderr."""


def state_path(d):
    return os.path.join(d, "apiserver.json")


def load(d):
    try:
        return cluster.read_state(state_path(d))
    except (OSError, ValueError) as e:
        raise ServerError(f"no API server in {d} ({e})")


def save(d, state):
    cluster.write_state(state_path(d), state)


def token(user):
    return f"{user}-token"


def write_credentials(d):
    """The service accounts' signing key (EC P-256: fast to make) and the static tokens."""
    cluster.openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=d)
    with open(os.path.join(d, "tokens.csv"), "w") as f:
        for user, (name, groups) in USERS.items():
            f.write(f'{token(user)},{name},uid-{user}' + (f',"{groups}"' if groups else "") + "\n")


def spawn(state):
    d = state["dir"]
    args = [state["apiserver"], f"--etcd-servers=http://{state['etcd_endpoint']}",
            f"--bind-address={state['bind']}", f"--advertise-address={state['bind']}",
            "--endpoint-reconciler-type=none", f"--secure-port={state['port']}",
            f"--cert-dir={os.path.join(d, 'certs')}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={os.path.join(d, 'sa.key')}",
            f"--service-account-signing-key-file={os.path.join(d, 'sa.key')}",
            f"--token-auth-file={os.path.join(d, 'tokens.csv')}", "--authorization-mode=RBAC",
            # A setting only: nothing is sent to that range.
            "--service-cluster-ip-range=10.96.0.0/24", "--api-audiences=api"]
    with open(os.path.join(d, "apiserver.log"), "ab") as log:
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    state["pid"] = p.pid


def request(state, path, body=None, content_type=None):
    """An HTTPS request as admin; returns (status, body)."""
    context = ssl.create_default_context(cafile=os.path.join(state["dir"], "certs", "apiserver.crt"))
    headers = {"Authorization": f"Bearer {token('admin')}"}
    if content_type:
        headers["Content-Type"] = content_type
    r = urllib.request.Request(state["url"] + path, data=body, headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(r, timeout=5.0, context=context) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def ready(state):
    ca = os.path.join(state["dir"], "certs", "apiserver.crt")
    if not os.path.exists(ca):
        return False
    try:
        status, body = request(state, "/readyz")
    except (OSError, ssl.SSLError):
        return False
    return status == 200 and body.strip() == b"ok"


def wait_ready(state, timeout):
    deadline = time.monotonic() + timeout
    while not ready(state):
        if not cluster.proc_alive(state["pid"]) or time.monotonic() >= deadline:
            with open(os.path.join(state["dir"], "apiserver.log"), errors="replace") as f:
                tail = "".join(f.readlines()[-15:])
            raise ServerError(f"kube-apiserver not ready within {timeout:.0f} s; its log ends:\n{tail}")
        time.sleep(0.1)


def write_kubeconfigs(state):
    ca = os.path.join(state["dir"], "certs", "apiserver.crt")
    paths = {}
    for user in USERS:
        path = os.path.join(state["dir"], f"kubeconfig-{user}")
        with open(path, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {state['url']}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    token: {token(user)}
contexts:
- name: {user}
  context:
    cluster: test
    user: {user}
    namespace: default
current-context: {user}
""")
        paths[user] = path
    state["kubeconfig"] = paths


def cmd_start(args):
    d = os.path.abspath(args.dir)
    if os.path.exists(state_path(d)):
        raise ServerError(f"{state_path(d)} exists: a server is already there (`apiserver.py stop --dir {d}`)")
    os.makedirs(d, exist_ok=True)
    etcd_dir = os.path.join(d, "etcd")
    cmd = [sys.executable, cluster.__file__, "start", "--members", "1", "--dir", etcd_dir, "--etcd", args.etcd]
    if args.owner:
        cmd += ["--owner", str(args.owner)]
    started = subprocess.run(cmd, capture_output=True, text=True)
    if started.returncode != 0:
        raise ServerError(f"etcd did not start: {started.stderr.strip()}")
    port = cluster.free_ports(1)[0]
    state = {"dir": d, "apiserver": args.apiserver, "bind": args.bind, "port": port,
             "url": f"https://{args.bind}:{port}", "etcd_endpoint": started.stdout.strip(), "etcd_dir": etcd_dir,
             "pid": None, "watchdog_pid": None}
    save(d, state)
    try:
        write_credentials(d)
        spawn(state)
        save(d, state)
        wait_ready(state, args.timeout)
        write_kubeconfigs(state)
        if args.owner:
            state["watchdog_pid"] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "watch", "--dir", d, "--owner", str(args.owner)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True).pid
        save(d, state)
    except BaseException:
        stop(state)
        raise
    print(json.dumps(state), flush=True)


def cmd_grant(args):
    """Each YAML document of the manifest POSTed as it is (the API server reads YAML bodies)."""
    state = load(os.path.abspath(args.dir))
    with open(args.manifest) as f:
        documents = [d for d in f.read().split("\n---\n") if d.strip()]
    for doc in documents:
        kind = next((line.split(":", 1)[1].strip() for line in doc.splitlines() if line.startswith("kind:")), None)
        if kind not in PATHS:
            raise ServerError(f"{args.manifest}: a {kind} cannot be granted here (known: {', '.join(PATHS)})")
        status, body = request(state, PATHS[kind], doc.encode(), "application/yaml")
        if status != 201:
            raise ServerError(f"creating the {kind} of {args.manifest} answered {status}: {body[:300]!r}")


def kill_apiserver(state):
    pid = state.get("pid")
    if pid and cluster.proc_is(pid, f"--secure-port={state['port']}"):
        os.kill(pid, signal.SIGKILL)
        if not cluster.wait_gone([pid], cluster.STOP_GRACE_S):
            raise ServerError(f"kube-apiserver {pid} survived SIGKILL")
    state["pid"] = None


def cmd_restart(args):
    d = os.path.abspath(args.dir)
    state = load(d)
    kill_apiserver(state)
    spawn(state)
    save(d, state)
    wait_ready(state, args.timeout)


def stop(state):
    kill_apiserver(state)
    wd = state.get("watchdog_pid")
    if wd and wd != os.getpid() and cluster.proc_is(wd, "watch"):
        os.kill(wd, signal.SIGKILL)
    if os.path.exists(cluster.state_path(state["etcd_dir"])):
        subprocess.run([sys.executable, cluster.__file__, "stop", "--dir", state["etcd_dir"]], check=False)
    subprocess.run(["rm", "-rf", "--", state["dir"]], check=False)


def cmd_stop(args):
    stop(load(os.path.abspath(args.dir)))


def cmd_watch(args):
    """Stops everything once the owner process is gone; ends by itself when the server is stopped."""
    d = os.path.abspath(args.dir)
    while os.path.exists(state_path(d)):
        if not cluster.proc_alive(args.owner):
            try:
                stop(load(d))
            except ServerError:
                pass
            return
        time.sleep(0.5)


def cmd_keys(args):
    """Prints the rendezvous key of every Lease of namespace `default` muster made, one a line, sorted."""
    state = load(os.path.abspath(args.dir))
    status, body = request(state, "/apis/coordination.k8s.io/v1/namespaces/default/leases?labelSelector=muster.dev%2Fjob")
    if status != 200:
        raise ServerError(f"listing the Leases answered {status}: {body[:200]!r}")
    lines = []
    for item in json.loads(body)["items"]:
        meta = item["metadata"]
        line = meta.get("annotations", {}).get("muster.dev/key", meta["name"])
        if args.owners:
            owners = [f"{o['kind']}/{o['name']}" for o in meta.get("ownerReferences", [])]
            line += "\t" + (",".join(owners) or "-")
        lines.append(line)
    print("\n".join(sorted(lines)))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start")
    start.add_argument("--apiserver", required=True, help="the kube-apiserver binary (ensure_kube_apiserver)")
    start.add_argument("--etcd", required=True, help="an etcd 3.5 binary (ensure_etcd35)")
    start.add_argument("--bind", default="127.0.0.1", help="the address it listens on and advertises")
    start.add_argument("--owner", type=int, default=None, help="stop everything once this PID is gone")
    for name in ("grant", "restart", "stop", "watch", "keys"):
        sub.add_parser(name)
    sub.choices["watch"].add_argument("--owner", type=int, required=True)
    sub.choices["grant"].add_argument("--manifest", required=True)
    sub.choices["keys"].add_argument("--owners", action="store_true", help="each key's owners after a tab")
    for name, sp in sub.choices.items():
        sp.add_argument("--dir", required=True)
        if name in ("start", "restart"):
            sp.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for /readyz")
    args = p.parse_args(argv)
    if args.cmd == "start":
        for flag in ("apiserver", "etcd"):
            path = getattr(args, flag)
            if not os.access(path, os.X_OK):
                p.error(f"--{flag} {path}: not an executable (run `source scripts/lib.sh; ensure_kube_apiserver; ensure_etcd35`)")
            setattr(args, flag, os.path.abspath(path))
    return args


COMMANDS = {"start": cmd_start, "grant": cmd_grant, "restart": cmd_restart, "stop": cmd_stop, "watch": cmd_watch, "keys": cmd_keys}


def main(argv):
    args = parse(argv)
    try:
        COMMANDS[args.cmd](args)
    except (ServerError, cluster.ClusterError) as e:
        print(f"apiserver.py {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
