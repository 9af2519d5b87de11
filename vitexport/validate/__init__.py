"""Validation at scale: a candidate against the reference over a user's whole labelled set, decoded once per run
and streamed in bounded memory (`evaluate`); the figures and their intervals are parity's.

Imports data, parity and the base modules; the bench, the precision step's held-out check, the OpenVINO IR check
and predict use it.
"""
