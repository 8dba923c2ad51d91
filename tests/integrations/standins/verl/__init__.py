"""Stand-in for verl: as verl/__init__.py does, imports the modules named in
VERL_USE_EXTERNAL_MODULES (how refit's checkpoint engine registers in every
verl process)."""

import importlib
import os

for _module in filter(None, os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")):
    importlib.import_module(_module)
