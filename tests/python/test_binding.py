"""The binding against the C headers (one process): struct layouts and enum
values restated in python/refit/_lib.py, one exception class per status code,
errors carrying the C message and status, the library lookup."""

import collections.abc
import os
import re
import subprocess
import sys
import tempfile

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
               "float32": "F32", "uint8": "U8"}[name]
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
    # The pure-Python list the agent client names its errors from
    # (refit._status) is the header's, and the classes are the same objects.
    from refit import _status
    assert ["ERR_" + n for n in _status.NAMES] == rows
    assert all(refit.BY_STATUS[c] is _status.error_class(_status.c_name(c))
               for c in refit.BY_STATUS)


def test_errors_named_after_builtins_subclass_them(tmp_path):
    """refit.TimeoutError is a TimeoutError (and an OSError with it);
    refit.SystemError a SystemError; the others only refit.Error."""
    assert issubclass(refit.TimeoutError, TimeoutError)
    assert issubclass(refit.SystemError, SystemError)
    e = refit.error("TIMEOUT", "vote of version 3 missed its deadline")
    assert isinstance(e, TimeoutError) and str(e) == \
        "REFIT_ERR_TIMEOUT: vote of version 3 missed its deadline"
    assert not issubclass(refit.PeerError, (OSError, SystemError))
    missing = tmp_path / "missing.yaml"
    with pytest.raises(FileNotFoundError):
        refit.Session(str(missing))


def test_error_carries_c_message_and_status(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  family: qwen3_moe\n  hiden_size: 128\n")
    with pytest.raises(refit.ConfigError) as info:
        refit.Session(str(bad))
    e = info.value
    assert e.status == refit.CODE["CONFIG"] and e.status_name == "REFIT_ERR_CONFIG"
    assert str(bad) in e.message or "config" in e.message.lower()
    assert str(e).startswith("REFIT_ERR_CONFIG: ")


class _Config(collections.abc.Mapping):
    """A read-only mapping that is no dict, as OmegaConf's DictConfig."""

    def __init__(self, d):
        self._d = d

    def __getitem__(self, k):
        v = self._d[k]
        return _Config(v) if isinstance(v, dict) else v

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


def test_config_as_dict_or_mapping():
    """Session takes the config itself, as a dict or a mapping: the C
    library reads it (its problems named as from a file), and no file is
    left behind."""
    before = set(os.listdir(tempfile.gettempdir()))
    for config in ({"model": {"family": "qwen3_moe", "hiden_size": 128}},
                   _Config({"model": {"family": "qwen3_moe", "hiden_size": 128}})):
        with pytest.raises(refit.ConfigError) as info:
            refit.Session(config)
        assert any("hiden_size" in p for p in info.value.problems), info.value.problems
    with pytest.raises(TypeError):
        refit.Session(42)
    assert not [f for f in set(os.listdir(tempfile.gettempdir())) - before
                if f.startswith("refit-config.")]


def test_missing_library_is_named():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env["REFIT_LIBRARY"] = "/nonexistent/librefit.so"
    # `import refit` loads no library (the agent client needs none); the MPI
    # binding names the missing library at its first use.
    r = subprocess.run([sys.executable, "-c", "import refit; refit.attach; refit.Session"],
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "/nonexistent/librefit.so" in r.stderr, r.stderr
    assert "ImportError" in r.stderr, r.stderr


def test_mpi_library_is_mpi4pys():
    """librefit.so calls the MPI library mpi4py initialized: the same
    MPI_Get_library_version text, from a libmpi mapped in this process."""
    from mpi4py import MPI
    version, where = _lib.mpi_library
    assert version == MPI.Get_library_version().replace("\x00", "").strip(), _lib.mpi_library
    assert where and os.path.realpath(where) in _lib._mapped_mpi(), (where, _lib._mapped_mpi())


STANDIN_MPI4PY = '''
def get_config():
    return {"mpicc": "/opt/mpich/bin/mpicc"}
'''
STANDIN_MPI = '''
def Get_library_version():
    return "MPICH Version:\\t4.1.2\\nMPICH Release date: Wed Jun  7 15:22:45 CDT 2023\\x00"
'''


def test_other_mpi_in_mpi4py_is_refused(tmp_path):
    """An mpi4py on another MPI than librefit's (here a stand-in that
    reports MPICH, without starting MPI) is refused at the binding's first
    use, naming both libraries and what to do, before any session opens."""
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text(STANDIN_MPI4PY)
    (tmp_path / "mpi4py" / "MPI.py").write_text(STANDIN_MPI)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", "import refit; refit.Session"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "ImportError: refit: mpi4py and librefit.so use " \
        "different MPI libraries" in r.stderr, r.stderr
    assert "MPICH Version:\t4.1.2" in r.stderr and _lib.mpi_library[0] in r.stderr, r.stderr
    assert "/opt/mpich/bin/mpicc" in r.stderr and _lib.path in r.stderr, r.stderr
