"""Scheduling policies (fcfs-easy, mms, ubis) and victim selection.

Why here and pure: the live agent and the simulator must make the same decisions from the
same state. Every module in this package is a function of a ClusterView (or of the small
arrays the simulator keeps, through the same core functions) and configuration; nothing in
it talks to an RMS, libvirt or the store.
"""
