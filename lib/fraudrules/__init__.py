"""fraudrules: Flink-style dynamic fraud rules on Spark Structured Streaming + Delta Lake.

What a cluster runs: `config`, `session`, `tables`, `rules` (model, store, codec, shadow comparison), `engine`
(the streaming job), `backtest`, `ops` (health, state, data quality) and the `cli`. `analyst` (the notebooks'
helpers) needs the wheel's `analyst` extra, and nothing outside it imports it.
"""

__version__ = "0.1.0"
