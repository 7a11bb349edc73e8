"""Derived figures from model records: summaries, tables, pandas frames."""
