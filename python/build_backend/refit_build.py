"""A PEP 517 build backend for the `refit` Python package, standard library
only, so that `pip install .` works offline in a fresh venv (no setuptools
or wheel to fetch; Debian 12's venv has neither `wheel` nor a setuptools
that builds wheels without it).

It packs python/refit/*.py into a pure-Python wheel (py3-none-any) with the
metadata below. The package's agent client (refit.attach) needs nothing
else; the in-process MPI binding (refit.Session) finds librefit.so through
REFIT_LIBRARY or, for a package used from this checkout, build/.
"""

import base64
import hashlib
import os
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
WHEEL = "Wheel-Version: 1.0\nGenerator: refit_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _files():
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name), "rb") as f:
                yield "%s/%s" % (NAME, name), f.read()


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


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
        f.write(WHEEL)
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "%s-%s-py3-none-any.whl" % (NAME, VERSION)
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                         zipfile.ZIP_DEFLATED) as z:
        entries = list(_files()) + [
            ("%s/METADATA" % _dist_info(), METADATA.encode()),
            ("%s/WHEEL" % _dist_info(), WHEEL.encode())]
        for path, data in entries:
            z.writestr(path, data)
            records.append(_record_line(path, data))
        records.append("%s/RECORD,," % _dist_info())
        z.writestr("%s/RECORD" % _dist_info(), "\n".join(records) + "\n")
    return name
