"""fraudrules: Flink-style dynamic fraud rules on Spark Structured Streaming + Delta Lake.

What a cluster runs: `config`, `session`, `tables`, `rules` (model, store, codec), `engine` (the streaming
job), `backtest`, `ops` (health, state, data quality), `analyst` (notebook helpers) and the `cli`.
"""

__version__ = "0.1.0"
