"""Start tests/agent/client.py processes without paying for torch each time.

    zygote.py SOCKET

An interpreter that imports what client.py imports (torch above all: about
1.5 s of CPU per interpreter on the 2-core CI machine, most of an agent
test's client start-up) and then, for each request on the Unix socket
SOCKET, forks a process that runs client.py as its __main__. The forked
process is a client as a fresh `python client.py ...` is: its own pid,
nothing of MPI or librefit loaded (the zygote loads neither), CUDA first
initialized in it; the agents see no difference.

One connection per client. The request is one JSON line: {"argv": [...],
"log": PATH}; client.py's standard output and error go to PATH. The zygote
answers {"pid": N} once the process exists and {"status": S} (a wait
status) when it ends, then closes the connection. ZygoteClient in
test_agent.py wraps a connection as a subprocess.Popen-like handle.
"""

import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLIENT = os.path.join(HERE, "client.py")
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]

# What client.py imports, in its order; refit is the package only (no
# librefit, no MPI: client.py asserts both after it attaches).
import numpy  # noqa: E402,F401
import torch  # noqa: E402,F401
import refit  # noqa: E402,F401
import refit_testlib  # noqa: E402,F401
import megatron_rules  # noqa: E402,F401
import yaml  # noqa: E402,F401

assert "mpi4py" not in sys.modules and "refit._lib" not in sys.modules


def run_client(argv, log):
    """In the forked process: client.py with argv, output to log. Never
    returns."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = [CLIENT, *argv]
        try:
            runpy.run_path(CLIENT, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # what an uncaught exception does to a script
            traceback.print_exc()
            code = 1
        import atexit
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code)


def send(conn, msg):
    try:
        conn.sendall((json.dumps(msg) + "\n").encode())
    except OSError:
        pass  # the test that asked is gone: nothing to tell


def main():
    path = sys.argv[1]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    children = {}  # pid -> connection
    parent = os.getppid()
    print("zygote: ready", flush=True)
    while os.getppid() == parent:  # gone with the test that started it
        for key, _ in sel.select(timeout=0.02):
            conn, _ = server.accept()
            with conn.makefile("r") as f:
                req = json.loads(f.readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                sel.close()
                server.close()
                for c in children.values():
                    c.close()
                conn.close()
                run_client(req["argv"], req["log"])
            children[pid] = conn
            send(conn, {"pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                send(conn, {"status": status})
                conn.close()


if __name__ == "__main__":
    main()
