"""The keys `scontrol show job|node|partition` prints, in the order it prints them.

Why a table: a `key=value` line of scontrol is ambiguous as soon as a value holds spaces and
a user chose that value (a job name, a comment, a path). Knowing which keys scontrol prints,
in which order, which of them users write, and which key follows each of those lets the
reader cut a user's text at the one place scontrol itself ends it, and recognise a record
whose text imitates other keys (a key twice, or a key out of its place) instead of trusting
the first `UserId=` it meets. Orders are those of Slurm 17.11-22.05 (src/api/job_info.c,
node_info.c, partition_info.c); only keys whose place is the same in all of them are ranked.
"""

from __future__ import annotations

# Keys of a job, ranked in print order. Records must show the ranked keys they hold in this
# order; a key printed only by some versions is left out of the ranking (it still splits).
JOB_ORDER: tuple[str, ...] = (
    "JobId",
    "ArrayJobId",
    "ArrayTaskId",
    "JobName",
    "UserId",
    "GroupId",
    "Priority",
    "Nice",
    "Account",
    "QOS",
    "JobState",
    "Reason",
    "Dependency",
    "Requeue",
    "Restarts",
    "BatchFlag",
    "Reboot",
    "ExitCode",
    "RunTime",
    "TimeLimit",
    "TimeMin",
    "SubmitTime",
    "EligibleTime",
    "StartTime",
    "EndTime",
    "Deadline",
    "Partition",
    "AllocNode:Sid",
    "ReqNodeList",
    "ExcNodeList",
    "NodeList",
    "BatchHost",
    "NumNodes",
    "NumCPUs",
    "NumTasks",
    "CPUs/Task",
    "TRES",
    "MinCPUsNode",
    "MinMemoryNode",
    "MinMemoryCPU",
    "MinTmpDiskNode",
    "Features",
    "Command",
    "WorkDir",
    "AdminComment",
    "SystemComment",
    "Comment",
    "StdErr",
    "StdIn",
    "StdOut",
)
# Keys some versions print after StdOut (or instead of the Std* lines for non-batch jobs).
JOB_TAIL: tuple[str, ...] = (
    "BurstBuffer",
    "BurstBufferState",
    "CpuFreqMin",
    "CpuFreqMax",
    "CpuFreqGov",
    "Power",
    "CpusPerTres",
    "MemPerTres",
    "TresBind",
    "TresFreq",
    "TresPerJob",
    "TresPerNode",
    "TresPerSocket",
    "TresPerTask",
    "MailUser",
    "MailType",
    "NtasksPerTRES",
    "Container",
    "ContainerID",
)
# Fields whose value a user writes and which may hold spaces: each ends only where one of its
# possible successors begins (the key scontrol prints next; several when the next is optional).
_AFTER_WORKDIR = ("AdminComment", "SystemComment", "Comment", "StdErr", "StdIn", "StdOut", *JOB_TAIL)
JOB_FREE_TEXT: dict[str, tuple[str, ...]] = {
    "JobName": ("UserId",),
    "Command": ("WorkDir",),
    "WorkDir": _AFTER_WORKDIR,
    "AdminComment": _AFTER_WORKDIR[1:],
    "SystemComment": _AFTER_WORKDIR[2:],
    "Comment": _AFTER_WORKDIR[3:],
    "StdErr": ("StdIn", *JOB_TAIL),
    "StdIn": ("StdOut", *JOB_TAIL),
    "StdOut": JOB_TAIL,
    "MailUser": ("MailType", "NtasksPerTRES", "Container", "ContainerID"),
    "Container": ("ContainerID",),
    "ContainerID": (),
}
# Keys vjob reads, which every version prints for every job.
JOB_REQUIRED: tuple[str, ...] = (
    "JobId",
    "UserId",
    "JobState",
    "BatchFlag",
    "TimeLimit",
    "SubmitTime",
    "NodeList",
    "NumNodes",
    "NumCPUs",
)
# At most one of these is printed (memory asked per node or per CPU).
JOB_ONE_OF: tuple[tuple[str, ...], ...] = (("MinMemoryNode", "MinMemoryCPU"),)

NODE_ORDER: tuple[str, ...] = (
    "NodeName",
    "Arch",
    "CoresPerSocket",
    "CPUAlloc",
    "CPUTot",
    "CPULoad",
    "AvailableFeatures",
    "ActiveFeatures",
    "Gres",
    "NodeAddr",
    "NodeHostName",
    "RealMemory",
    "AllocMem",
    "FreeMem",
    "Sockets",
    "Boards",
    "State",
    "ThreadsPerCore",
    "TmpDisk",
    "Weight",
    "Owner",
    "MCS_label",
    "Partitions",
    "BootTime",
    "SlurmdStartTime",
    "CfgTRES",
    "AllocTRES",
    "CapWatts",
    "CurrentWatts",
    "AveWatts",
)
# An admin writes a node's Reason and Comment; "OS=" holds spaces ("Linux 5.10.0-21-amd64 #1 ...").
NODE_FREE_TEXT: dict[str, tuple[str, ...]] = {
    "OS": ("RealMemory",),
    "Comment": ("Extra", "Reason", "ExtSensorsJoules"),
    "Extra": ("Reason", "ExtSensorsJoules"),
    "Reason": ("Comment", "Extra", "ExtSensorsJoules"),
}
NODE_REQUIRED: tuple[str, ...] = ("NodeName", "State")

PARTITION_ORDER: tuple[str, ...] = (
    "PartitionName",
    "AllowGroups",
    "AllowAccounts",
    "DenyAccounts",
    "AllowQos",
    "AllocNodes",
    "Default",
    "QoS",
    "DefaultTime",
    "DisableRootJobs",
    "ExclusiveUser",
    "GraceTime",
    "Hidden",
    "MaxNodes",
    "MaxTime",
    "MinNodes",
    "LLN",
    "MaxCPUsPerNode",
    "Nodes",
    "PriorityJobFactor",
    "PriorityTier",
    "RootOnly",
    "ReqResv",
    "OverSubscribe",
    "OverTimeLimit",
    "PreemptMode",
    "State",
    "TotalCPUs",
    "TotalNodes",
)
PARTITION_FREE_TEXT: dict[str, tuple[str, ...]] = {}
PARTITION_REQUIRED: tuple[str, ...] = ("PartitionName",)
