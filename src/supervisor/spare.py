# muster's warm spare (src/supervisor/spare.rs): run as `python -u -c THIS MODULES ARGS...`, where ARGS are the
# worker's own interpreter arguments after -u (SCRIPT..., -m MODULE..., or -c CODE...). It imports MODULES
# while the current workers run, tells the agent it is ready, and waits on its stdin (a Unix socket) for the
# next start: three descriptors (the worker's stdin, stdout, stderr) and the worker's whole environment as
# JSON (after its length, 8 bytes big-endian). Then it becomes the worker, as `python -u ARGS...` would have
# started it.
def _muster_spare():
    import json, os, socket, sys

    modules, argv = sys.argv[1], sys.argv[2:]
    # sys.path[0] as the interpreter sets it for ARGS, so a module the script imports from its own
    # directory is the one warmed (with PYTHONSAFEPATH it prepends nothing, for -c either).
    if getattr(sys.flags, "safe_path", False):
        pass
    elif argv[0] == "-m":
        sys.path[0] = os.getcwd()
    elif argv[0] != "-c":
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    for name in filter(None, modules.split(",")):
        try:
            __import__(name)
        except Exception as e:
            print(f"muster: warm spare: cannot import {name} ({e!r}); the worker will import it itself",
                  file=sys.stderr, flush=True)
    ctrl = socket.socket(fileno=os.dup(0))
    try:
        ctrl.sendall(b"R")
    except OSError:
        pass  # the agent already handed over and closed its end: the hand-over is still there to read
    # The hand-over is an 8-byte length and that much JSON, read exactly: reading on to end-of-file could
    # meet ECONNRESET instead, when the agent closed its end with our readiness byte still unread there.
    try:
        data, fds, _, _ = socket.recv_fds(ctrl, 1 << 16, 3)
        data = bytearray(data)
        while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
            chunk = ctrl.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        print(f"muster: warm spare: lost the agent's socket ({e})", file=sys.stderr, flush=True)
        os._exit(1)
    if len(fds) != 3 or len(data) < 8 or len(data) != 8 + int.from_bytes(data[:8], "big"):
        # No (whole) hand-over: the agent closed the socket. Never exit 0, which would read as a worker's
        # success.
        os._exit(1)
    ctrl.close()
    env = json.loads(bytes(data[8:]))
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.environ.pop("MUSTER_WARM_SPARE", None)  # only the spare is one (spare.rs: SPARE_VAR)
    return argv


def _muster_run(argv):
    # Only locals from here on: the module namespace these functions live in is about to become the
    # worker's __main__.
    import builtins, importlib.machinery, os, runpy, sys

    g = sys.modules["__main__"].__dict__
    g.clear()
    g.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __annotations__={},
             __builtins__=builtins)
    if argv[0] == "-m":
        sys.argv = ["-m"] + argv[2:]
        runpy._run_module_as_main(argv[1])
    elif argv[0] == "-c":
        sys.argv = ["-c"] + argv[2:]
        g["__loader__"] = importlib.machinery.BuiltinImporter
        exec(compile(argv[1], "<string>", "exec"), g)
    else:
        sys.argv = list(argv)
        path = os.path.abspath(argv[0])
        g.update(__file__=path, __cached__=None, __loader__=importlib.machinery.SourceFileLoader("__main__", path))
        with open(argv[0], "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec"), g)


_muster_run(_muster_spare())
