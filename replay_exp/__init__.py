"""replay-exp."""

from pathlib import Path

# The checkout's root (an editable install's): conf/, analysis/results/ and the measured inputs
# the defaults name live under it.
PROJECT = Path(__file__).resolve().parents[1]
