"""The benchmark harness (``python -m bench``) and the calibration scripts it keeps beside it."""
