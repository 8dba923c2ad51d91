"""One MPI job, both roles: the first ranks train (train.py), the others
serve (engine.py), as the config's trainer and generator sections say.

    launch/refit-launch examples/python/moe.yaml -- build/venv/bin/python examples/python/run.py examples/python/moe.yaml [--steps N]
"""

import argparse

import yaml

import engine
import refit
import train

ap = argparse.ArgumentParser()
ap.add_argument("config")
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--lr", type=float, default=3e-3, help="the trainer's AdamW learning rate")
args = ap.parse_args()
cfg = yaml.safe_load(open(args.config))
with refit.Session(args.config) as s:
    if s.side == "trainer":
        train.run(s, cfg, args.steps, args.lr)
    else:
        engine.run(s, cfg, args.steps)
