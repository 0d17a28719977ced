"""vjob core: the domain model, configuration, state store, logging, CLI and agent loop.

Every other package (ubis_priority, preemption, provisioning, saline_bew, plugins,
simulator) imports from here; nothing here imports them except the CLI, lazily.
"""

__version__ = "0.1.0"
