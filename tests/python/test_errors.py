"""Errors a person can act on (issue 37, defect 9), one process that starts
jobs of its own: an uncaught exception on one rank ends the job in seconds,
not refit.timeout_s; Ctrl-C interrupts a rank's wait within a second and
the job ends; a bad config's problems come with the exception, a missing
one is a FileNotFoundError."""

import os
import subprocess
import sys
import time

import pytest

import refit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TIMEOUT_S = 60  # refit.timeout_s of the jobs: every bound below is far under it


def job_config(tmp_path):
    text = open(os.path.join(HERE, "megatron_mxfp8.yaml")).read()
    path = tmp_path / "job.yaml"
    path.write_text(text.replace("timeout_s: 30", "timeout_s: %d" % TIMEOUT_S))
    return str(path)


def run_job(tmp_path, mode):
    """Start robust_job.py on every rank of the config's job (outside this
    process's own MPI job); (exit status, output, seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    build = os.path.dirname(os.path.dirname(refit.library_path))
    cmd = [os.path.join(ROOT, "launch", "refit-launch"), "--build-dir", build,
           job_config(tmp_path), "--", sys.executable, os.path.join(HERE, "robust_job.py"),
           job_config(tmp_path), mode]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S - 10)
    except subprocess.TimeoutExpired as e:
        pytest.fail("the job still ran after %d s (refit.timeout_s %d):\n%s%s" % (
            TIMEOUT_S - 10, TIMEOUT_S, e.stdout or "", e.stderr or ""))
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0


def test_uncaught_exception_ends_the_job(tmp_path):
    rc, out, took = run_job(tmp_path, "raise")
    assert rc != 0, out
    assert "rank 0 fails before its first begin" in out, out
    assert "aborting the MPI job" in out, out
    assert took < 30, "%.1f s:\n%s" % (took, out)


def test_ctrl_c_interrupts_a_wait(tmp_path):
    rc, out, took = run_job(tmp_path, "sigint")
    assert rc != 0, out
    assert "KeyboardInterrupt" in out, out
    waited = float(out.split("interrupted after ")[1].split()[0])
    assert waited < 2.0 + 3.0, out  # SIGINT at 2 s, a wait slice is 0.2 s
    assert took < 30, "%.1f s:\n%s" % (took, out)


def test_config_error_carries_problems(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  family: qwen3_moe\n  hiden_size: 128\n")
    with pytest.raises(refit.ConfigError) as info:
        refit.Session(str(bad))
    problems = info.value.problems
    assert isinstance(problems, list) and problems
    assert any("hiden_size" in p and "hidden_size" in p for p in problems), problems
    assert all(str(bad) in p for p in problems), problems


def test_missing_config_is_file_not_found(tmp_path):
    missing = str(tmp_path / "nowhere.yaml")
    with pytest.raises(FileNotFoundError) as info:
        refit.Session(missing)
    e = info.value
    assert isinstance(e, refit.Error) and e.filename == missing
    assert missing in str(e)
