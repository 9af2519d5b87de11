"""Parity statistics: how far one backend's outputs are from the reference's (cosine, max abs, top-k agreement,
accuracy), the bounds per precision (`Thresholds`) and the verdict (`ParityVerdict`).

Pure numpy; imports only the base modules (errors).
"""
