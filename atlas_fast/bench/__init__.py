"""What ``atlas-fast bench`` measures: its corpus, readers, patterns, runner and report.

The command itself (arguments, output) is ``atlas_fast.cli.bench``. The corpus generator here
is also the one benchmarks/ builds its datasets with.
"""
