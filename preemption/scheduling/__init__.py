"""The one scheduling pass (`tick.decide`) and its parts: policy orders (policies.py), EASY
backfilling (easy.py), victim selection (victims.py), node choice (nodes.py).

Why here and pure: the live agent and the simulator must make the same decisions from the
same state. `tick.decide` is a function of a ClusterView and the configuration that the agent
runs at every tick; the simulator runs the same pass over its own arrays with compiled hot
paths, held equal to `tick.decide` by tests/test_decision_differential.py. Nothing in this
package talks to an RMS, libvirt or the store.
"""
