"""The binding against the C headers (one process): struct layouts and enum
values restated in python/refit/_lib.py, one exception class per status code,
errors carrying the C message and status, the library lookup."""

import os
import re
import subprocess
import sys

import pytest

import refit
from refit import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = open(os.path.join(ROOT, "runtime", "include", "refit", "refit.h")).read()
STATUS = open(os.path.join(ROOT, "runtime", "include", "refit", "status.h")).read()


def struct_fields(name):
    body = re.search(r"typedef struct \{([^{}]*)\}\s*%s;" % name, HEADER).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for decl in body.split(";"):
        for part in decl.split(","):
            m = re.search(r"(\w+)\s*(\[\d+\])?\s*$", part.strip())
            if m:
                fields.append(m.group(1))
    return fields


def test_structs_match_header():
    assert [f for f, _ in _lib.Tensor._fields_] == struct_fields("refit_tensor_t")
    assert [f for f, _ in _lib.Times._fields_] == struct_fields("refit_times_t")
    assert [f for f, _ in _lib.WireStats._fields_] == struct_fields("refit_wire_stats_t")


def test_enums_match_header():
    for value, name in _lib.DTYPES.items():
        tag = {"bfloat16": "BF16", "float8_e4m3fn": "E4M3", "float8_e8m0fnu": "E8M0",
               "float32": "F32"}[name]
        assert re.search(r"REFIT_TENSOR_%s = %d\b" % (tag, value), HEADER)
    states = re.search(r"#define REFIT_STATE_MAP\(X\)(.*?)\n\n", HEADER, re.S).group(1)
    assert tuple(n.lower() for n in re.findall(r"X\((\w+),", states)) == _lib.STATES
    for value, name in _lib.SIDES.items():
        assert re.search(r"REFIT_SIDE_%s = %d\b" % (name.upper(), value), HEADER)


def test_one_error_class_per_status():
    rows = re.findall(r"X\((ERR_\w+),", STATUS)
    assert [refit.BY_STATUS[c].__name__ for c in sorted(refit.BY_STATUS)] == [
        "".join(w.capitalize() for w in r[4:].split("_")) + "Error" for r in rows]
    assert issubclass(refit.TimeoutError, refit.Error)
    assert refit.CODE["TIMEOUT"] == rows.index("ERR_TIMEOUT") + 1


def test_error_carries_c_message_and_status(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  family: qwen3_moe\n  hiden_size: 128\n")
    with pytest.raises(refit.ConfigError) as info:
        refit.Session(str(bad))
    e = info.value
    assert e.status == refit.CODE["CONFIG"] and e.status_name == "REFIT_ERR_CONFIG"
    assert str(bad) in e.message or "config" in e.message.lower()
    assert str(e).startswith("REFIT_ERR_CONFIG: ")


def test_missing_library_is_named():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env["REFIT_LIBRARY"] = "/nonexistent/librefit.so"
    # `import refit` loads no library (the agent client needs none); the MPI
    # binding names the missing library at its first use.
    r = subprocess.run([sys.executable, "-c", "import refit; refit.attach; refit.Session"],
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "/nonexistent/librefit.so" in r.stderr, r.stderr
    assert "ImportError" in r.stderr, r.stderr
