"""Saline best-effort wrapper for OAR: the wrapper command, the job manager that snapshots and
redeploys killed best-effort vjobs, the snapshot repository and gathering schedule, and
network identity allocation.
"""
