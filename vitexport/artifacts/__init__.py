"""The model folder and its records: every file name (`folder`), the typed manifest (`manifest`), the plans'
sidecars (`sidecar`), one writer per folder (`workspace`), whether each file is the one its record describes
(`verify`) and `vitexport info`'s view of a folder (`status`).

Plain files and records: imports data (Preprocess), parity (ParityStats) and the base modules; never torch.
"""
