"""A PEP 517 build backend for the `refit` Python package, standard library
only, so that `pip install .` works offline in a fresh venv (no setuptools
or wheel to fetch; Debian 12's venv has neither `wheel` nor a setuptools
that builds wheels without it).

It packs python/refit/ (its .py files, subpackages included) into a
pure-Python wheel (py3-none-any) with the metadata below and the entry
points pyproject.toml declares (vLLM finds refit's weight-transfer backend
through one). The package's agent client (refit.attach) needs nothing
else; the in-process MPI binding (refit.Session) needs librefit.so.

One config setting, `build-dir`: a CMake build of this tree (absolute, or
relative to the tree), whose runtime/librefit.so the wheel then carries as
refit/_native/librefit.so, tagged for this platform (py3-none-linux_x86_64:
ctypes loads it, so it fits any Python 3):

    pip install --config-settings build-dir=build .

Without it the wheel is pure Python and refit.Session looks for librefit.so
on the dynamic loader's path (`cmake --install build`, then ldconfig) or at
REFIT_LIBRARY (python/refit/_lib.py says the order). The library links the
MPI, YAML, HDF5 and UCX libraries of the machine it was built on; the
wheel bundles none of them.
"""

import base64
import hashlib
import os
import sysconfig
import zipfile

NAME = "refit"
VERSION = "0.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python", NAME)
METADATA = """Metadata-Version: 2.1
Name: refit
Version: {v}
Summary: refit: trained weights to inference ranks, re-sharded, quantized and in place
Requires-Python: >=3.9
Provides-Extra: mpi
Requires-Dist: mpi4py; extra == "mpi"
Provides-Extra: torch
Requires-Dist: torch; extra == "torch"
Requires-Dist: numpy; extra == "torch"
""".format(v=VERSION)
NATIVE = "%s/_native/librefit.so" % NAME


def _library(config_settings):
    """The librefit.so the wheel carries (None: a pure wheel)."""
    build = (config_settings or {}).get("build-dir")
    if not build:
        return None
    path = os.path.join(ROOT, build, "runtime", "librefit.so")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            "refit_build: build-dir=%s has no runtime/librefit.so (looked at %s): "
            "build it first (cmake -S . -B %s && cmake --build %s)" % (build, path, build, build))
    return path


def _tag(config_settings):
    if _library(config_settings) is None:
        return "py3-none-any"
    return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _wheel_text(config_settings):
    return ("Wheel-Version: 1.0\nGenerator: refit_build\nRoot-Is-Purelib: %s\nTag: %s\n"
            % ("true" if _library(config_settings) is None else "false", _tag(config_settings)))


def _files():
    for folder, dirs, names in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    yield "%s/%s" % (NAME, os.path.relpath(path, PACKAGE)), f.read()


def _entry_points():
    """entry_points.txt from pyproject.toml's [project.entry-points.*]
    tables (tomllib where Python has it, 3.11+; else the simple
    `name = "value"` lines those tables hold)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        data = f.read()
    try:
        import tomllib
        groups = tomllib.loads(data.decode()).get("project", {}).get("entry-points", {})
    except ImportError:
        groups, group = {}, None
        for line in data.decode().splitlines():
            line = line.strip()
            if line.startswith("["):
                head = line.strip("[]").strip()
                group = head[len("project.entry-points."):].strip('"') \
                    if head.startswith("project.entry-points.") else None
                if group:
                    groups[group] = {}
            elif group and "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                groups[group][key.strip()] = value.strip().strip('"')
    return "".join("[%s]\n%s\n" % (g, "".join("%s = %s\n" % kv for kv in sorted(eps.items())))
                   for g, eps in sorted(groups.items()))


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def _add(z, path, data):
    info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    # Executable bits for the library, as a linker leaves it.
    info.external_attr = (0o755 if path == NATIVE else 0o644) << 16
    z.writestr(info, data)


def _dist_info():
    return "%s-%s.dist-info" % (NAME, VERSION)


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(METADATA)
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(_wheel_text(config_settings))
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write(_entry_points())
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "%s-%s-%s.whl" % (NAME, VERSION, _tag(config_settings))
    library = _library(config_settings)
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                         zipfile.ZIP_DEFLATED) as z:
        entries = list(_files()) + [
            ("%s/METADATA" % _dist_info(), METADATA.encode()),
            ("%s/WHEEL" % _dist_info(), _wheel_text(config_settings).encode()),
            ("%s/entry_points.txt" % _dist_info(), _entry_points().encode())]
        if library is not None:
            with open(library, "rb") as f:  # the file a versioned symlink names
                entries.append((NATIVE, f.read()))
        for path, data in entries:
            _add(z, path, data)
            records.append(_record_line(path, data))
        records.append("%s/RECORD,," % _dist_info())
        _add(z, "%s/RECORD" % _dist_info(), ("\n".join(records) + "\n").encode())
    return name
