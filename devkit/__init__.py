"""The dev kit: the one-machine development cluster, the demo, libvirtd helpers, test guests
and probes. Top layer: nothing in the runtime packages imports it; it may import all of them.
"""
