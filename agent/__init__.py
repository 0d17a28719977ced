"""The orchestrators of the live system: the agent loop (observe → decide → plan → journal →
act → record), its recovery, the in-job pilot (`vjob run`) and the `vjob agent/status/prio`
commands. Layer 4: it drives the adapters (plugins) and the switch machinery (preemption).
"""
