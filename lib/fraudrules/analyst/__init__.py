"""Analyst notebooks' helpers: parameters and query runs, views over the tables, plots.

Plots need the wheel's `analyst` extra; the streaming job's wheel installs without it."""

from importlib.util import find_spec

EXTRA = "fraudrules.analyst needs the analyst extra (plots): pip install 'fraudrules[analyst]'"

if find_spec("matplotlib") is None:
    raise ModuleNotFoundError(EXTRA)
