"""What runs inside a real vjob guest: its init (`vjob-init`) and the guest agent.

Why files here and not code imported by vjob: both are copied into every image by
provisioning.image_build and run inside the guest with the guest's own Python (stdlib only);
the host imports `agent` only in tests, to check the job description it reads.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT = HERE / "agent.py"
"""Installed as /usr/sbin/vjob-guest-agent."""
INIT = HERE / "vjob-init"
"""Installed as /sbin/vjob-init, the guest's PID 1 (kernel command line `init=/sbin/vjob-init`)."""
GUEST_LIB = "/usr/lib/vjob-guest"
"""Where the image holds the agent's helper modules; agent.py puts it on sys.path in the guest."""


def helper_modules() -> list[Path]:
    """The agent's helper modules: every other .py file of this directory (stdlib only, like the
    agent), installed under GUEST_LIB and part of the image's cache key. Looked up at each call,
    so a module added here reaches the next image build with no list to update."""
    return sorted(p for p in HERE.glob("*.py") if p.name not in {"agent.py", "__init__.py"})
