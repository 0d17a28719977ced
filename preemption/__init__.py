"""Preemption: victim selection, the Entropy context-switch planner and its cost model, the
plan executor, deadline-aware admission and heterogeneity remapping.
"""
