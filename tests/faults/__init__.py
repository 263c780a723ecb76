"""Fault-injection tests: kills, signals, full disks, corrupt checkpoints, races, NaNs, hostile input, no data."""
