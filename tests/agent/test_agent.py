"""refit agents with plain framework processes attached (docs/agent.md).

Each test starts the agents as an MPI job through launch/refit-launch, then
trainer and engine processes as plain processes (no mpirun, no MPI in them,
as torchrun ranks, vLLM workers or Ray actors are: tests/agent/client.py,
forked by tests/agent/zygote.py, which has imported torch once for them
all), and judges the outcome from their exit codes and output. The
engines compare every byte they hold after each refit with
tests/reference/vllm_rules.py.

REFIT_BUILD_DIR names the build whose refit-agent runs (the sanitizer pass
runs these tests against its ASan build).
"""

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("REFIT_BUILD_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(ROOT, "python"))
import refit  # noqa: E402

def test_import_loads_no_mpi():
    """`import refit`, and pytest's probing of the module while collecting
    this file, start no MPI and load no librefit in the framework process."""
    assert "mpi4py" not in sys.modules and "refit._lib" not in sys.modules
    assert not [k for k in os.environ if k.startswith("OMPI_COMM_WORLD")]


GRACE = 12  # refit-agent --attach-grace: room for a process to start torch
# test_engine_never_attached waits the grace out on purpose: a short one,
# with every process of its second refit attached before that refit begins.
SHORT_GRACE = 3


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    return env


class Zygote:
    """tests/agent/zygote.py, started on first use: an interpreter that has
    imported torch forks the client.py processes (ZygoteClient), so that
    each starts in milliseconds instead of importing torch again (about
    1.5 s of CPU each). REFIT_AGENT_TEST_FORK=0 starts every client as a
    fresh interpreter instead."""

    proc = None
    path = None

    @classmethod
    def socket_path(cls):
        if cls.proc is None:
            d = tempfile.mkdtemp(prefix="refit-zygote.")
            cls.path = os.path.join(d, "s")
            cls.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "zygote.py"),
                                         cls.path], stdout=subprocess.PIPE, text=True,
                                        env=_env())
            line = cls.proc.stdout.readline()
            assert line.startswith("zygote: ready"), "zygote.py did not start: %r" % line
        return cls.path

    @classmethod
    def stop(cls):
        if cls.proc is not None:
            cls.proc.kill()
            cls.proc.wait()
            shutil.rmtree(os.path.dirname(cls.path), ignore_errors=True)
            cls.proc = None


@pytest.fixture(scope="session", autouse=True)
def zygote():
    yield
    Zygote.stop()


class ZygoteClient:
    """A client.py process forked by the zygote, with the part of
    subprocess.Popen's interface the tests use (args, pid, returncode, poll,
    wait, kill, send_signal). Its exit status arrives on the connection."""

    def __init__(self, args, log):
        self.args, self.returncode, self._buf = args, None, b""
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(Zygote.socket_path())
        self._conn.sendall((json.dumps({"argv": args[2:], "log": log}) + "\n").encode())
        self.pid = None
        while self.pid is None:
            self._read(None)

    def _read(self, timeout):
        """Take what the zygote said within timeout (None: wait)."""
        if not select.select([self._conn], [], [], timeout)[0]:
            return
        data = self._conn.recv(4096)
        if not data:
            raise RuntimeError("the zygote closed client %s's connection without its exit "
                               "status" % self.args[2:4])
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            msg = json.loads(line)
            if "pid" in msg:
                self.pid = msg["pid"]
            if "status" in msg:
                self.returncode = os.waitstatus_to_exitcode(msg["status"])
                self._conn.close()

    def poll(self):
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.time() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(left)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)


class Job:
    """The agents of one config, and the client processes of a test."""

    def __init__(self, config, tmp, grace=GRACE):
        self.config = os.path.join(HERE, config)
        self.grace = grace
        self.dir = os.path.join(tmp, "s")
        self.log = open(os.path.join(tmp, "agents.log"), "w+")
        self.tmp = tmp
        self.agents = subprocess.Popen(
            [os.path.join(ROOT, "launch", "refit-launch"), "--build-dir", BUILD, self.config,
             "--", os.path.join(BUILD, "runtime", "refit-agent"), "--socket-dir", self.dir,
             "--attach-grace", str(grace), self.config],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(self.dir, "ready")):
            assert self.agents.poll() is None, "agents exited: " + self.agent_log()
            assert time.time() < deadline, "agents not ready: " + self.agent_log()
            time.sleep(0.1)
        self.clients = []

    def agent_log(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def await_log(self, text, timeout=30):
        """Wait until the agents' log shows `text`: an agent's lines reach it
        through mpirun's forwarding, some time after what they report."""
        deadline = time.time() + timeout
        while text not in self.agent_log():
            assert time.time() < deadline, "no %r in the agents' log:\n%s" % (
                text, self.agent_log())
            time.sleep(0.1)

    def client(self, side, rank, *extra, python_args=()):
        out = open(os.path.join(self.tmp, "%s%d.%d.log" % (side, rank, len(self.clients))),
                   "w+")
        args = [sys.executable, os.path.join(HERE, "client.py"), side, str(rank), self.config,
                self.dir, *extra]
        if python_args or os.environ.get("REFIT_AGENT_TEST_FORK") == "0":
            p = subprocess.Popen(args[:1] + list(python_args) + args[1:], stdout=out,
                                 stderr=subprocess.STDOUT, env=_env())
        else:
            p = ZygoteClient(args, out.name)
        p.out = out
        self.clients.append(p)
        return p

    def wait(self, p, timeout=120):
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            pytest.fail("client %s timed out:\n%s\nagents:\n%s"
                        % (p.args[2:4], output(p), self.agent_log()))
        return output(p)

    def gate(self, version):
        """Client arguments that hold a process before `version` until
        open_gate: a restarted process can take longer than the attach grace
        to start torch on a loaded machine, and a refit begun before it is
        attached is refused (test_engine_never_attached tests that)."""
        return ("--gate", str(version), os.path.join(self.tmp, "gate.%d" % version))

    def open_gate(self, version, *procs, timeout=120):
        """Once every process of `procs` has attached, let the processes held
        by gate(version) go."""
        deadline = time.time() + timeout
        for p in procs:
            while "attached " not in output(p):
                if p.poll() is not None or time.time() > deadline:
                    pytest.fail("client %s never attached:\n%s\nagents:\n%s"
                                % (p.args[2:4], output(p), self.agent_log()))
                time.sleep(0.05)
        open(self.gate(version)[2], "w").close()

    def others(self, p):
        return "".join("\n--- %s (pid %d):\n%s" % (" ".join(q.args[2:4]), q.pid, output(q))
                       for q in self.clients if q is not p)

    def close(self, expect_clean=True):
        for p in self.clients:
            if p.poll() is None:
                p.kill()
                p.wait()
        if not expect_clean:
            # The whole session: refit-launch waits on mpirun, and a SIGTERM
            # to it alone would leave mpirun and the agents running.
            os.killpg(self.agents.pid, signal.SIGTERM)
        try:
            rc = self.agents.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            os.killpg(self.agents.pid, signal.SIGKILL)
            self.agents.wait()
        assert not expect_clean or rc == 0, "agents ended with %s:\n%s" % (rc, self.agent_log())
        assert "AddressSanitizer" not in self.agent_log(), self.agent_log()
        self.log.close()


def output(p):
    p.out.flush()
    with open(p.out.name) as f:
        return f.read()


@pytest.fixture
def tmp():
    with tempfile.TemporaryDirectory(prefix="refit-agent-test.") as d:
        os.chmod(d, 0o700)
        yield d


def ranks(config):
    import yaml
    with open(os.path.join(HERE, config)) as f:
        cfg = yaml.safe_load(f)
    t, g = cfg["trainer"], cfg["generator"]
    return (t.get("tp", 1) * t.get("pp", 1) * t.get("dp", 1),
            g.get("tp", 1) * g.get("engines", 1))


def ok(job, p, versions=(1, 2, 3)):
    out = job.wait(p)
    assert p.returncode == 0, "%s exited %s:\n%s\nagents:\n%s\nother clients:%s" % (
        p.args[2:4], p.returncode, out, job.agent_log(), job.others(p))
    for v in versions:
        assert "committed %d " % v in out, out
    return out


@pytest.mark.parametrize("config", ["moe_mxfp8.yaml", "dense_pp2_async.yaml",
                                    "moe_prequantize_ep.yaml"])
def test_refit_three_versions(tmp, config):
    """Trainers and engines that never call MPI refit 3 versions through the
    agents; every engine byte is checked against vLLM's rules."""
    job = Job(config, tmp)
    ntrainer, ngen = ranks(config)
    engines = [job.client("generator", g) for g in range(ngen)]
    # The trainers' tensors get new storage before version 2: the client
    # registers them again and the agents map the new memory.
    trainers = [job.client("trainer", t, "--swap-at", "2", *job.gate(1),
                           *(["--shutdown"] if t == 0 else [])) for t in range(ntrainer)]
    job.open_gate(1, *engines)
    for p in trainers + engines:
        ok(job, p)
    job.close()


def test_trainer_killed_mid_refit_then_reattached(tmp):
    """A trainer process SIGKILLed inside refit 2: every other process's
    refit 2 fails naming the rank and its pid, the agents stay up, the
    restarted process re-attaches and refit 3 (a full one) is exact."""
    job = Job("moe_mxfp8.yaml", tmp)
    engines = [job.client("generator", g, "--expect-fail", "2") for g in range(2)]
    t0 = job.client("trainer", 0, "--expect-fail", "2", "--shutdown", *job.gate(3))
    t1 = job.client("trainer", 1, "--versions", "1,2", "--die-in-refit", "2")
    out = job.wait(t1)
    assert t1.returncode == -signal.SIGKILL, out
    pid = t1.pid
    job.open_gate(3, job.client("trainer", 1, "--versions", "3"))
    for p in [t0] + engines:
        text = ok(job, p, versions=(1, 3))
        assert "failed 2 as expected" in text, text
        line = [x for x in text.splitlines() if x.startswith("failed 2")][0]
        assert "trainer rank 1" in line and "pid %d" % pid in line, line
    ok(job, job.clients[-1], versions=(3,))
    job.await_log("detached")
    job.close()


def test_engine_killed_mid_refit_then_reattached(tmp):
    """An engine process SIGKILLed inside refit 2 (sync mode, in place): the
    refit fails everywhere naming it; a new engine process registers new
    memory, and refit 3 lands in it in full, every byte exact."""
    job = Job("moe_mxfp8.yaml", tmp)
    trainers = [job.client("trainer", t, "--expect-fail", "2", *job.gate(3),
                           *(["--shutdown"] if t == 0 else [])) for t in range(2)]
    g0 = job.client("generator", 0, "--expect-fail", "2")
    g1 = job.client("generator", 1, "--versions", "1,2", "--die-in-refit", "2")
    job.wait(g1)
    assert g1.returncode == -signal.SIGKILL
    g1b = job.client("generator", 1, "--versions", "3")
    job.open_gate(3, g1b)
    for p in trainers + [g0]:
        text = ok(job, p, versions=(1, 3))
        line = [x for x in text.splitlines() if x.startswith("failed 2")][0]
        assert "generator rank 1" in line and "pid %d" % g1.pid in line, line
    ok(job, g1b, versions=(3,))
    job.close()


def test_engine_never_attached(tmp):
    """Trainers begin while no engine process is attached: the refit is
    refused within the grace, naming each engine rank."""
    job = Job("moe_mxfp8.yaml", tmp, grace=SHORT_GRACE)
    t = [job.client("trainer", r, "--versions", "1", "--expect-fail", "1") for r in range(2)]
    start = time.time()
    for p in t:
        text = job.wait(p, timeout=job.grace + 60)
        assert p.returncode == 0, text
        line = [x for x in text.splitlines() if x.startswith("failed 1")][0]
        assert "generator rank 0" in line and "generator rank 1" in line, line
        assert "no framework process" in line, line
    assert time.time() - start < job.grace + 40
    # The job is still usable: engines come, the next refit works (begun
    # once every process attached: the short grace is no room to start torch).
    engines = [job.client("generator", g, "--versions", "2") for g in range(2)]
    t = [job.client("trainer", r, "--versions", "2", *job.gate(2),
                    *(["--shutdown"] if r == 0 else [])) for r in range(2)]
    job.open_gate(2, *engines, *t)
    for p in engines + t:
        ok(job, p, versions=(2,))
    job.close()


def _raw(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(20)
    return s


def _closed(s):
    """The agent closed the connection (after an optional reply)."""
    try:
        data = s.recv(1 << 16)
        while data:
            more = s.recv(1 << 16)
            if not more:
                break
            data += more
    except ConnectionResetError:
        data = b""
    s.close()
    return data


def host_config(tmp, config):
    """A copy of `config` with refit.device_map: none, so that its agents
    hold host memory on a GPU machine too: a test whose own process speaks
    to them holds no CUDA event to attach a GPU rank with."""
    import yaml
    with open(os.path.join(HERE, config)) as f:
        cfg = yaml.safe_load(f)
    cfg.setdefault("refit", {})["device_map"] = "none"
    path = os.path.join(tmp, "host-" + os.path.basename(config))
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def test_attach_twice_and_malformed_messages(tmp):
    """A second process on an attached rank is refused naming the first;
    malformed, truncated and oversized messages end only their connection;
    the agent keeps serving and the job refits afterwards."""
    job = Job(host_config(tmp, "moe_mxfp8.yaml"), tmp)
    path = os.path.join(job.dir, "trainer.0.sock")
    head = struct.Struct("<IHHII")
    bad = [
        b"GET / HTTP/1.1\r\n\r\n",                                   # not the protocol
        head.pack(0x47414652, 9, 0, 2, 0) + b"{}",                   # another version
        head.pack(0x47414652, 1, 0, 1 << 30, 0),                      # oversized
        head.pack(0x47414652, 1, 0, 100, 0) + b'{"op": "hel',         # truncated
        head.pack(0x47414652, 1, 0, 7, 0) + b"[1,2,3]",               # not an object
        head.pack(0x47414652, 1, 0, 5, 0) + b"{,,,}",                 # not JSON
        head.pack(0x47414652, 1, 0, 2, 3) + b"{}",                    # fds announced, none
        head.pack(0x47414652, 1, 0, 17, 0) + b'{"op":"register"}',    # not a hello
    ]
    for msg in bad:
        s = _raw(path)
        s.sendall(msg)
        if msg.startswith(head.pack(0x47414652, 1, 0, 100, 0)):
            s.shutdown(socket.SHUT_WR)  # the peer stops mid-message
        reply = _closed(s)
        if reply:
            body = json.loads(reply[16:])
            assert body["ok"] is False and "hello" in body["error"], body
    try:
        c = refit.attach("trainer", 0, socket_dir=job.dir)
    except refit.AgentError:
        pytest.fail(job.agent_log())
    with pytest.raises(refit.AgentError) as info:
        refit.attach("trainer", 0, socket_dir=job.dir)
    assert "already serves pid %d" % os.getpid() in info.value.message
    # A process that leaves and one that attaches at once, as a restarted
    # one does: the newcomer is let in whether or not the agent served the
    # hang-up first (it used to be refused naming the process that left).
    for _ in range(20):
        c.close()
        c = refit.attach("trainer", 0, socket_dir=job.dir)
    # An attached client's malformed message ends its own connection only.
    c._sock.sendall(head.pack(0x47414652, 1, 0, 4, 0) + b"nope")
    assert _closed(c._sock) == b""
    c._sock = None
    with pytest.raises(refit.AgentError) as info:
        c.status()
    assert info.value.status == "REFIT_ERR_STATE"
    log = job.agent_log()
    for words in ("not a refit agent message", "version 9", "1073741824 bytes",
                  "middle of a message", "not one JSON object", "announces 3 descriptors",
                  "the first message must be hello"):
        assert words in log, (words, log)
    ntrainer, ngen = ranks("moe_mxfp8.yaml")
    procs = [job.client("generator", g, "--versions", "1") for g in range(ngen)]
    procs += [job.client("trainer", t, "--versions", "1", *(["--shutdown"] if t == 0 else []))
              for t in range(ntrainer)]
    for p in procs:
        ok(job, p, versions=(1,))
    job.close()


def test_foreign_user_refused(tmp):
    """Another user cannot attach: the socket is 0600 in a 0700 directory,
    and where both are opened up the agent still refuses the peer's uid."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    job = Job("moe_mxfp8.yaml", tmp)
    path = os.path.join(job.dir, "trainer.0.sock")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(job.dir).st_mode & 0o777 == 0o700
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
             "try:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print('refused', e.errno);"
             " sys.exit(0)\ns.settimeout(20)\nprint('connected', len(s.recv(100)))\n")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 sys.executable, "-c", probe, path]
    out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("refused 13"), out  # EACCES
    os.chmod(tmp, 0o755)
    os.chmod(job.dir, 0o755)
    os.chmod(path, 0o777)
    out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "connected 0", out  # closed at once, nothing said
    job.await_log("refused a connection from uid 65534")
    os.chmod(path, 0o600)
    job.close(expect_clean=False)


def test_ctrl_c_while_waiting_then_reattach(tmp):
    """An engine process waiting for the next version is interrupted
    (Ctrl-C): it exits within seconds, its agent notices, and a new engine
    process takes the next refit in full."""
    job = Job("moe_mxfp8.yaml", tmp)
    engines = [job.client("generator", g, "--versions", "1,2") for g in range(2)]
    trainers = [job.client("trainer", t, "--versions", "1") for t in range(2)]
    for p in trainers:
        ok(job, p, versions=(1,))
    deadline = time.time() + 60
    while "committed 1" not in output(engines[1]):
        assert time.time() < deadline
        time.sleep(0.1)
    time.sleep(1.0)  # engine 1 is now waiting in next_version
    t = time.time()
    engines[1].send_signal(signal.SIGINT)
    text = job.wait(engines[1], timeout=30)
    assert time.time() - t < 5, "SIGINT took %.1f s" % (time.time() - t)
    assert "KeyboardInterrupt" in text, text
    job.await_log("generator 1: client pid %d detached" % engines[1].pid)
    again = job.client("generator", 1, "--versions", "2")
    trainers = [job.client("trainer", t, "--versions", "2", *job.gate(2),
                           *(["--shutdown"] if t == 0 else [])) for t in range(2)]
    job.open_gate(2, again)
    for p in trainers + [engines[0], again]:
        ok(job, p, versions=(2,))
    job.close()


VENV_CLIENT = """
import os, sys, time, refit
side, rank, sock, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = refit.attach(side, rank, socket_dir=sock)
print("attached %s %d" % (side, rank), flush=True)
while side == "trainer" and not os.path.exists(gate):
    time.sleep(0.05)
for v in (1, 2):
    if side == "trainer":
        c.refit(v)
    else:
        c.refit()
        assert c.committed_version == v and c.verify() == 0, (v, c.committed_version)
    print("committed %d " % v, flush=True)
assert "mpi4py" not in sys.modules and "refit._lib" not in sys.modules
"""


def shutdown(job):
    """Stop the agents once every client is done (a trainer that stopped them
    itself could cut an engine's last verify short)."""
    refit.attach("trainer", 0, socket_dir=job.dir).shutdown()


def synthetic_round(job, python, env):
    """One process per rank of `job` (a synthetic-source config) runs
    VENV_CLIENT under `python`: two versions, engines verified by their
    agents; then the agents are stopped."""
    ntrainer, ngen = ranks(job.config)
    procs = []
    for side, n in (("generator", ngen), ("trainer", ntrainer)):
        for r in range(n):
            log = open(os.path.join(job.tmp, "%s%d.synthetic.log" % (side, r)), "w+")
            p = subprocess.Popen([python, "-c", VENV_CLIENT, side, str(r), job.dir,
                                  job.gate(1)[2]],
                                 cwd=job.tmp, stdout=log, stderr=subprocess.STDOUT, env=env)
            p.out = log
            job.clients.append(p)
            procs.append(p)
    job.open_gate(1, *procs)
    for p in procs:
        ok(job, p, versions=(1, 2))
    shutdown(job)
    job.close()


def test_pip_installed_client_in_a_fresh_venv(tmp):
    """`pip install .` in a fresh venv (offline, nothing else in it: no
    numpy, torch or mpi4py) gives a client that refits through the agents:
    the agents make the weights (synthetic source) and hold the engines'
    storage, and the engine processes ask their agents to verify it."""
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    py = os.path.join(venv, "bin", "python")
    out = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", ROOT],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    env = _env()
    del env["PYTHONPATH"]  # the venv's installed package, not the tree's
    probe = subprocess.run([py, "-c", "import refit, sys; print(refit.__file__); "
                            "import mpi4py"], capture_output=True, text=True, cwd=tmp,
                           env=env, timeout=60)
    assert venv in probe.stdout and "No module named 'mpi4py'" in probe.stderr, probe
    synthetic_round(Job("moe_synthetic_c.yaml", tmp), py, env)


MATRIX = sorted(os.path.join(d, f) if d else f
                for d in ("", "fp8_block", "nvfp4")
                for f in os.listdir(os.path.join(ROOT, "tests", "mpi", d)) if f.endswith(".yaml"))


@pytest.mark.skipif(os.environ.get("REFIT_AGENT_MATRIX") != "1",
                    reason="the whole matrix takes minutes on 2 cores: REFIT_AGENT_MATRIX=1 runs it")
@pytest.mark.parametrize("config", MATRIX)
def test_mpi_matrix_through_agents(tmp, config):
    """Every layout of the MPI test matrix (tests/mpi: tp, pp with uneven
    stages, ep, dp replicas, engines, BF16 and MXFP8 in each backend,
    prequantized, async; block FP8 and NVFP4 in tests/mpi/fp8_block and
    tests/mpi/nvfp4) refits two
    versions through agents: the agents make
    the weights (synthetic source) and hold the engines' storage; each engine
    process asks its agent to verify every byte against the reference."""
    synthetic_round(Job(os.path.join("..", "mpi", config), tmp), sys.executable, _env())
