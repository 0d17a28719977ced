"""Trace-driven simulator: workload readers (SWF, Torque accounting) and generators, a
discrete-event cluster model, and the same policy code as the live agent.
"""
