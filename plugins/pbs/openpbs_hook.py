# ruff: noqa: UP006, UP022, UP031, UP035, UP045 - kept runnable on the Python 3.6 of older PBS installations
"""OpenPBS / PBS Pro hook for vjob, run by the PBS server and MoMs with their `pbs` module.

One hook script, five events (install: deploy/pbs/README.md):

* queuejob (server): derives the job's class from what the user cannot forge — `qsub -I`
  (`job.interactive`) or a queue in the operator's `interactive_queues` / `besteffort_queues`,
  else batch — and takes the OS image from `-v VJOB_OS=...` or `-l aoe=...`; refuses an OS
  image the site does not offer with a message qsub shows the user, and writes VJOB_CLASS /
  VJOB_OS into the job's Variable_List for the pilot. A VJOB_CLASS the user set (`-v`, `-V`)
  is overwritten, never obeyed (the adapter, too, derives the class again from `interactive`
  and the queue): otherwise any batch job could claim interactive priority. With
  `deadline_threshold_file` set (the agent's `[deadline] threshold_file`), a job with a deadline
  (`-v VJOB_DEADLINE=EPOCH`) and a walltime is refused when its x-factor is at or over the X
  the agent publishes there, with the message job_submit.lua gives (docs/deadline.md); a
  missing, malformed or stale file means no check (fail open).
  A job naming no image in one of the operator's `vjob_queues` gets that queue's image (the
  site default: no `#VJOB` line needed); `-v VJOB_OS=off` (or `#PBS -v VJOB_OS=off` in the
  script: the server never sees the script, qsub turns that line into the variable) opts out
  where `allow_opt_out` is true and is refused, saying so, where not.
  A batch job that will run in a VM is refused, with the numbers, when a chunk's memory
  (`select=...:mem=`, else its share of `-l mem=`), minus the VM's overhead (`vm_overhead_mib`,
  the pilot's `[provisioning] vm_overhead_mib`), is below the guest's minimum (`guest_min_mib`),
  or is above the largest node's memory (`node_max_mib`, MiB; 0: not checked): the operator sets
  it to the largest `resources_available.mem` of the vjob nodes (docs/realjobs.md, "Size").
* execjob_launch (MoM, before the job's top shell): a batch job whose VJOB_OS is a real image
  (not the counter guest debian-tiny, not "off") runs `vjob run --rms pbs --os IMAGE --script
  - --` instead of the shell, from $PBS_O_WORKDIR: the MoM hands the job script to the top
  shell on its standard input (start_exec.c's script_in), so the pilot reads it, byte for
  byte, unchanged. The image goes in as an argument, never into the shell's text. Tasks
  spawned later (PBS_TASKNUM > 1: pbsdsh, mpiexec) and interactive jobs launch unchanged.
* runjob (server): logs the derived class and OS of every job PBS starts (the audit trail for
  the agent's decisions); it never refuses a start.
* execjob_postsuspend (MoM, after `qsig -s suspend` or PBS's own suspend-preemption): runs
  `checkpoint_command` so a suspended vjob holds no memory on the node, and leaves a marker
  (state_dir/<job>.saved, 0600). If the checkpoint fails the job stays suspended in memory,
  which is what PBS would have done without vjob: the hook accepts.
* execjob_preresume (MoM, before the resume): when the marker says the VM was saved, runs
  `restore_command`; if that fails the hook refuses the resume with the pilot's message,
  because resuming the job's processes without their VM would run nothing while holding the
  nodes. A job without the marker resumes exactly as PBS would resume it.

The commands are argument lists; `{job_id}` becomes the checked job id and `{node}` this
MoM's node name. deploy/pbs/vjob_hook.json ships `python3 -m plugins.pbs.hook_vm save|restore
vjob-pbs-{job_id} --node {node}`: the job's VM (named by the pilot `vjob run --rms pbs`) is run
by libvirtd, not by the job's processes, so it keeps running under a PBS suspend unless it is
saved. That command needs no database: with the state store down it saves and restores from
the node's own state file and manifest and records to the store once it is back, so a
database outage never keeps suspended jobs suspended. Empty commands switch this off (PBS
then suspends in memory).

Fail open: any error inside the hook itself (a bug, an unreadable configuration) is logged
to the PBS log and the event is accepted, so vjob can never stop PBS from queueing or
running jobs. The pilot runs as an argument list with a timeout below the hook's alarm.

Why no `vjob` import: the hook runs inside PBS's own Python (3.6 or newer on the supported
OpenPBS releases), where vjob is usually not installed; the pilot command line is the only
link (`checkpoint_command` / `restore_command` in the hook configuration file).
"""

import json
import os
import re
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

import pbs

CLASSES = ("batch", "interactive", "besteffort")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
SELECT_AOE = re.compile(r"(?:^|:)aoe=([^:+]+)")
JOB_ID = re.compile(r"[0-9]{1,18}(\[[0-9]{0,9}\])?(\.[A-Za-z0-9][A-Za-z0-9._-]{0,235})?")
DEFAULTS = {
    "os_images": [],
    "interactive_queues": ["interactive"],
    "besteffort_queues": [],
    "checkpoint_command": [],
    "restore_command": [],
    "command_timeout_s": 240,
    "state_dir": "/var/spool/pbs/vjob",
    "deadline_threshold_file": "",
    "vjob_queues": {},
    "allow_opt_out": False,
    "vjob_command": "/usr/local/bin/vjob",
    "vm_overhead_mib": 256,
    "guest_min_mib": 256,
    "node_max_mib": 0,
}
COUNTER_IMAGE = "debian-tiny"  # the counter guest runs no script: never wrapped
OPT_OUT = "off"
# The top shell's replacement: $1 the vjob command, $2 the image (both checked), the script on stdin.
LAUNCH_SH = (
    'if [ -n "$PBS_O_WORKDIR" ]; then cd "$PBS_O_WORKDIR" || exit 2; fi; '
    'exec "$1" run --rms pbs --os "$2" --script - --'
)
# The threshold file (preemption.deadline.threshold_file, whose reader this mirrors): one line.
THRESHOLD_LINE = re.compile(
    r"x=(-?\d{1,3}(?:\.\d{1,9})?) slowdown=(\d{1,3}(?:\.\d{1,9})?) at=(\d{1,12})(?: stale=(\d{1,5}))?\n?"
)
THRESHOLD_MAX_BYTES = 256
THRESHOLD_DEFAULT_STALE_S = 600
THRESHOLD_MAX_STALE_S = 86400
DEADLINE = re.compile(r"[0-9]{1,12}")
WALLTIME = re.compile(r"(?:(?:([0-9]{1,6}):)?([0-9]{1,6}):)?([0-9]{1,9})")
# A PBS size (`mem=4gb`, `4194304kb`; no unit: bytes; a word is 8 bytes).
SIZE = re.compile(r"([0-9]{1,15})(b|kb|mb|gb|tb|pb|w|kw|mw|gw|tw|pw)?", re.IGNORECASE)
SIZE_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50}
CHUNK_COUNT = re.compile(r"[0-9]{1,6}")
# One node's word of a usage file (vjob.usage_record, whose format this mirrors).
USAGE_WORD = re.compile(
    r"vjob-usage@[A-Za-z0-9][A-Za-z0-9.-]{0,62}:cpu_s=([0-9]{1,13}(?:\.[0-9]{1,3})?),peak_mib=([0-9]{1,13}),runs=[0-9]{1,7}"
)
USAGE_MAX_BYTES = 16384


class Refused(Exception):
    """The job asks for something the site does not offer; the message is for the user."""


def settings() -> Dict[str, Any]:
    """The hook configuration (JSON, imported with qmgr) over the defaults."""
    merged = dict(DEFAULTS)
    path = getattr(pbs, "hook_config_filename", None)
    if path:
        with open(path) as fh:
            loaded = json.load(fh)
        unknown = sorted(set(loaded) - set(DEFAULTS))
        if unknown:
            raise ValueError("unknown key(s) in the hook configuration: " + ", ".join(unknown))
        merged.update(loaded)
    for key in ("checkpoint_command", "restore_command"):
        command = merged[key]
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise ValueError(key + " must be a list of strings (empty: off)")
    return merged


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _variables(job: Any) -> Any:
    """The job's Variable_List (a dict-like pbs_env); created when the job has none."""
    if job.Variable_List is None:
        job.Variable_List = {}
    return job.Variable_List


def job_class(job: Any, cfg: Dict[str, Any]) -> str:
    """The class from `qsub -I` and the operator's queue lists, never from the user's VJOB_CLASS."""
    queue = _text(job.queue)
    if str(job.interactive).lower() in ("true", "1") or queue in cfg["interactive_queues"]:
        return "interactive"
    return "besteffort" if queue in cfg["besteffort_queues"] else "batch"


def classify(job: Any, cfg: Dict[str, Any]) -> Tuple[str, str]:
    """(class, OS image) of a job being queued, or Refused naming what is wrong."""
    variables = _variables(job)
    derived = job_class(job, cfg)
    image = _text(variables.get("VJOB_OS"))
    if not image and job.Resource_List is not None:
        image = _text(job.Resource_List["aoe"])
        chunk_aoe = SELECT_AOE.search(_text(job.Resource_List["select"]))
        if not image and chunk_aoe:
            image = chunk_aoe.group(1)
    image = queue_default(job, cfg, derived, image)
    if image and not NAME.fullmatch(image):
        raise Refused("OS image %r: a name has only letters, digits and . _ + - (at most 64)" % image)
    if image and cfg["os_images"] and image not in cfg["os_images"]:
        raise Refused("OS image %r is not offered here; choose one of %s" % (image, ", ".join(cfg["os_images"])))
    return derived, image


def queue_default(job: Any, cfg: Dict[str, Any], derived: str, image: str) -> str:
    """The image a batch job gets from its queue (the site default), "" for an allowed opt-out
    (VJOB_OS=off), or Refused where the operator allows none."""
    queue = _text(job.queue)
    default = cfg["vjob_queues"].get(queue) if isinstance(cfg["vjob_queues"], dict) else None
    if image.lower() == OPT_OUT:
        if default and not cfg["allow_opt_out"]:
            raise Refused(
                "every job of queue %s runs in a VM (image %s) and this site does not let a job opt out: "
                "remove VJOB_OS=off or submit to another queue" % (queue, default)
            )
        return ""
    if image or derived != "batch" or not default:
        return image
    return _text(default)


def launch(event: Any, cfg: Dict[str, Any]) -> Optional[str]:
    """Run the job's top shell as the pilot when its VJOB_OS names a real image."""
    job = event.job
    env = event.env if event.env is not None else {}
    image = _text((job.Variable_List or {}).get("VJOB_OS"))
    task = _text(env.get("PBS_TASKNUM"))
    if str(job.interactive).lower() in ("true", "1") or task not in ("", "1"):
        return None
    if not image or image == COUNTER_IMAGE or image.lower() == OPT_OUT:
        return None
    command = _text(cfg["vjob_command"])
    if not NAME.fullmatch(image) or not command.startswith("/"):
        return "vjob: cannot launch job %s in a VM: image %r or vjob_command %r" % (_text(job.id)[:80], image, command)
    event.progname = "/bin/sh"
    event.argv = ["/bin/sh", "-c", LAUNCH_SH, "vjob-launch", command, image]
    pbs.logmsg(pbs.LOG_DEBUG, "vjob: %s launched in a VM of image %s" % (_text(job.id)[:80], image))
    return None


def load_threshold(path: str, now: float) -> Optional[Tuple[float, float]]:
    """(X, slowdown) the agent published, or None (no check): missing, malformed, stale (older
    than the file's own stale=) or from the future — the rules of job_submit.lua's reader."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(THRESHOLD_MAX_BYTES + 1)
    except OSError:
        return None
    m = THRESHOLD_LINE.fullmatch(raw.decode("ascii", "replace")) if len(raw) <= THRESHOLD_MAX_BYTES else None
    if not m:
        return None
    x, slowdown, at = float(m.group(1)), float(m.group(2)), int(m.group(3))
    stale = int(m.group(4)) if m.group(4) else THRESHOLD_DEFAULT_STALE_S
    if slowdown <= 0 or not 1 <= stale <= THRESHOLD_MAX_STALE_S or now - at > stale or at - now > 60:
        return None
    return x, slowdown


def walltime_s(value: Any) -> Optional[int]:
    """Seconds of a walltime given as [[H:]M:]S (PBS's duration), None when absent or odd."""
    m = WALLTIME.fullmatch(_text(value))
    if not m:
        return None
    hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return hours * 3600 + minutes * 60 + seconds


def check_deadline(job: Any, cfg: Dict[str, Any], now: float) -> Optional[str]:
    """The refusal of a job that cannot be expected to meet its deadline, or None."""
    path = cfg["deadline_threshold_file"]
    deadline_text = _text(_variables(job).get("VJOB_DEADLINE"))
    if not path or not DEADLINE.fullmatch(deadline_text) or job.Resource_List is None:
        return None
    limit = walltime_s(job.Resource_List["walltime"])
    published = load_threshold(path, now)
    if not limit or published is None:
        return None
    threshold, slowdown = published
    remaining = limit * slowdown
    left = int(deadline_text) - now
    x = (remaining - left) / remaining
    if x < threshold:
        return None
    return (
        "vjob: refused: the job cannot be expected to meet its deadline: x = %.2f >= X = %.2f "
        "(time limit %d min x VM slowdown %.2f = %.0f min to run, deadline in %.0f min); "
        "ask for a later deadline or a shorter time limit"
        % (x, threshold, limit // 60, slowdown, remaining / 60, left / 60)
    )


def size_mib(text: str) -> Optional[int]:
    """A PBS size in whole MiB, None when it is not one."""
    m = SIZE.fullmatch(text.strip())
    if not m:
        return None
    unit = (m.group(2) or "b").lower()
    factor = 8 if unit.endswith("w") else 1  # a word
    return (int(m.group(1)) * factor << SIZE_SHIFT[unit[:-1]]) >> 20


def chunk_memories(resources: Any) -> List[Tuple[str, int]]:
    """(what the user wrote, MiB) of each chunk's memory: `select=2:ncpus=2:mem=4gb` chunk by
    chunk; a chunk without mem gets its share of a job-wide `-l mem=` (split evenly over the
    chunks). Empty when the job asks for no memory (the pilot reads PBS's figure at start)."""
    chunks = [c for c in _text(resources["select"]).split("+") if c]
    counted = []  # (count, mem text or "")
    for chunk in chunks or [""]:
        parts = chunk.split(":")
        count = int(parts[0]) if parts and CHUNK_COUNT.fullmatch(parts[0]) else 1
        mem = next((p[4:] for p in parts if p.startswith("mem=")), "")
        counted.append((count, mem))
    total = _text(resources["mem"])
    nodes = sum(c for c, _ in counted) or 1
    out = []
    for _count, mem in counted:
        if mem:
            mib = size_mib(mem)
            what = "mem=" + mem
        elif total:
            whole = size_mib(total)
            mib = None if whole is None else whole // nodes
            what = "mem=%s over %d chunk%s" % (total, nodes, "" if nodes == 1 else "s")
        else:
            continue
        if mib is None:
            raise Refused("%s: not a PBS size (e.g. 4gb, 512mb)" % what[:60])
        out.append((what, mib))
    return out


def memory_refusal(job: Any, cfg: Dict[str, Any], derived: str, image: str) -> Optional[str]:
    """The refusal of a batch job whose VM cannot fit a chunk's memory (issue 33): below the
    guest's minimum once the VM's overhead is taken, or above the largest node (`node_max_mib`,
    0: not checked); None otherwise, and for jobs that get no VM."""
    if derived != "batch" or not image or image == COUNTER_IMAGE or image.lower() == OPT_OUT:
        return None
    if job.Resource_List is None:
        return None
    overhead, floor, largest = int(cfg["vm_overhead_mib"]), int(cfg["guest_min_mib"]), int(cfg["node_max_mib"])
    for what, mib in chunk_memories(job.Resource_List):
        if mib - overhead < floor:
            return (
                "vjob: %s (%d MiB per node) leaves %d MiB for the VM after its overhead of %d MiB, below the "
                "guest's minimum of %d MiB: ask for at least mem=%dmb per chunk"
                % (what, mib, mib - overhead, overhead, floor, floor + overhead)
            )
        if largest > 0 and mib > largest:
            return (
                "vjob: %s (%d MiB per node) is more than the largest node's %d MiB, whose VM gets at most %d MiB "
                "(its memory minus the VM's overhead of %d MiB): ask for at most mem=%dmb per chunk"
                % (what, mib, largest, largest - overhead, overhead, largest)
            )
    return None


def queuejob(event: Any, cfg: Dict[str, Any]) -> Optional[str]:
    """Tag the job; the refusal message for the user, or None."""
    job = event.job
    try:
        derived, image = classify(job, cfg)
        too_big_or_small = memory_refusal(job, cfg, derived, image)
    except Refused as exc:
        return "vjob: " + str(exc)
    if too_big_or_small:
        return too_big_or_small
    try:
        refusal = check_deadline(job, cfg, time.time())
    except Exception as exc:  # noqa: BLE001 - fail open: the deadline check must not stop queueing
        pbs.logmsg(pbs.LOG_ERROR, "vjob hook: deadline check failed, job accepted: %s: %s" % (type(exc).__name__, exc))
        refusal = None
    if refusal:
        return refusal
    variables = _variables(job)
    claimed = _text(variables.get("VJOB_CLASS"))
    if claimed and claimed.lower() != derived:
        message = "vjob: VJOB_CLASS %r set by the user ignored, queued as %s" % (claimed[:40], derived)
        pbs.logmsg(pbs.LOG_WARNING, message)
    variables["VJOB_CLASS"] = derived
    if image:
        variables["VJOB_OS"] = image
    elif _text(variables.get("VJOB_OS")).lower() == OPT_OUT:
        variables["VJOB_OS"] = ""  # an allowed opt-out: no image for the adapter or the launch
    pbs.logmsg(pbs.LOG_DEBUG, "vjob: queued as %s, os %s" % (derived, image or "(any)"))
    return None


def runjob(event: Any, cfg: Dict[str, Any]) -> Optional[str]:
    job = event.job
    variables = job.Variable_List or {}
    pbs.logmsg(
        pbs.LOG_DEBUG,
        "vjob: starting %s class=%s os=%s"
        % (_text(job.id)[:80], job_class(job, cfg), _text(variables.get("VJOB_OS"))[:64] or "(any)"),
    )
    return None


def local_node() -> str:
    """This MoM's node name as PBS knows it (the host name's first label when PBS cannot say)."""
    getter = getattr(pbs, "get_local_nodename", None)
    name = getter() if getter is not None else ""
    return str(name or socket.gethostname().split(".")[0])


def pilot(command: List[str], job_id: str, timeout: float) -> Tuple[bool, str]:
    """Run the pilot command for one job: (succeeded, what it said)."""
    if not JOB_ID.fullmatch(job_id):
        return False, "job id %r is not a PBS job id" % job_id
    node = local_node()
    if not NAME.fullmatch(node):
        return False, "node name %r is not a valid node name" % node
    argv = [arg.replace("{job_id}", job_id).replace("{node}", node) for arg in command]
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return False, "%s: no answer within %g s; killed" % (argv[0], timeout)
    except OSError as exc:
        return False, "%s: cannot run: %s" % (argv[0], exc.strerror)
    # What it says it did (stdout) on success; why it failed (stderr) otherwise.
    first, second = (done.stdout, done.stderr) if done.returncode == 0 else (done.stderr, done.stdout)
    said = (first.strip() or second or b"").decode("utf-8", "replace").strip().splitlines()
    last = said[-1][:300] if said else ""
    if done.returncode != 0:
        return False, "%s: exit status %d: %s" % (argv[0], done.returncode, last or "(no message)")
    return True, last


def _marker(cfg: Dict[str, Any], job_id: str) -> str:
    """The file that says "this job's VM was saved by the hook" (job id already validated)."""
    return os.path.join(cfg["state_dir"], job_id + ".saved")


def postsuspend(event: Any, cfg: Dict[str, Any]) -> Optional[str]:
    job_id = _text(event.job.id)
    if not cfg["checkpoint_command"]:
        return None
    ok, said = pilot(cfg["checkpoint_command"], job_id, float(cfg["command_timeout_s"]))
    if not ok:
        pbs.logmsg(pbs.LOG_WARNING, "vjob: checkpoint of %s failed, job stays suspended in memory: %s" % (job_id, said))
        return None
    os.makedirs(cfg["state_dir"], mode=0o700, exist_ok=True)
    fd = os.open(_marker(cfg, job_id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (said + "\n").encode("utf-8", "replace"))
    os.close(fd)
    pbs.logmsg(pbs.LOG_DEBUG, "vjob: checkpointed %s: %s" % (job_id, said))
    return None


def preresume(event: Any, cfg: Dict[str, Any]) -> Optional[str]:
    """Restore the VM the hook saved; a job it did not save resumes as PBS would resume it."""
    job_id = _text(event.job.id)
    if not JOB_ID.fullmatch(job_id) or not os.path.exists(_marker(cfg, job_id)):
        return None
    ok, said = pilot(cfg["restore_command"], job_id, float(cfg["command_timeout_s"]))
    if not ok:
        return "vjob: cannot restore the VM of %s, not resuming: %s" % (job_id, said)
    os.unlink(_marker(cfg, job_id))
    pbs.logmsg(pbs.LOG_DEBUG, "vjob: restored %s: %s" % (job_id, said))
    return None


def epilogue(event: Any, cfg: Dict[str, Any]) -> Optional[str]:
    """The VMs' usage root measured on this node (state_dir/<job>.usage, plugins/pbs/accounting.py)
    into the operator's custom resources `resources_used.vjob_cpu_s` (CPU seconds, summed over
    the runs) and `vjob_peak_mem` (the largest resident memory); nothing without a usage file."""
    job_id = _text(event.job.id)
    try:
        if not JOB_ID.fullmatch(job_id):
            return None
        fd = os.open(os.path.join(cfg["state_dir"], job_id + ".usage"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(USAGE_MAX_BYTES + 1)
    found = [
        m for m in (USAGE_WORD.fullmatch(w) for w in raw[:USAGE_MAX_BYTES].decode("ascii", "replace").split()) if m
    ]
    if found and len(raw) <= USAGE_MAX_BYTES:
        cpu, peak = sum(float(m.group(1)) for m in found), max(int(m.group(2)) for m in found)
        event.job.resources_used["vjob_cpu_s"] = cpu
        event.job.resources_used["vjob_peak_mem"] = pbs.size("%dmb" % peak)
        pbs.logmsg(pbs.LOG_DEBUG, "vjob: %s VMs used %.2f CPU s, peak %d MiB" % (job_id, cpu, peak))
    return None


def end(event: Any, cfg: Dict[str, Any]) -> Optional[str]:
    """The job is over on this node: its usage file goes."""
    path = os.path.join(cfg["state_dir"], _text(event.job.id) + ".usage")
    if JOB_ID.fullmatch(_text(event.job.id)) and os.path.exists(path):
        os.unlink(path)
    return None


HANDLERS = {
    "QUEUEJOB": queuejob,
    "RUNJOB": runjob,
    "EXECJOB_POSTSUSPEND": postsuspend,
    "EXECJOB_PRERESUME": preresume,
    "EXECJOB_LAUNCH": launch,
    "EXECJOB_EPILOGUE": epilogue,
    "EXECJOB_END": end,
}


def main() -> None:
    event = pbs.event()
    refusal = None
    try:
        handler = None
        for name, function in HANDLERS.items():
            if getattr(pbs, name, object()) == event.type:
                handler = function
        if handler is not None:
            refusal = handler(event, settings())
    except Exception as exc:  # noqa: BLE001 - fail open: a fault in vjob must never stop PBS
        pbs.logmsg(pbs.LOG_ERROR, "vjob hook: internal error, event accepted: %s: %s" % (type(exc).__name__, exc))
        refusal = None
    if refusal:
        event.reject(refusal)
    else:
        event.accept()


main()
