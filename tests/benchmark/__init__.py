"""Tests of fedlearn_edu.benchmark, one file per module (the committed grids: test_benchmark_records.py)."""
