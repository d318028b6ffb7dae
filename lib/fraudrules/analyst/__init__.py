"""Analyst notebooks' helpers: parameters and query runs, views over the tables, plots."""
