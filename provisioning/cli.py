"""`vjob image …` (the OS image catalogue and its distribution) and `vjob vm …` (debugging VMs).

Why `vm` commands for operators: when a context switch fails half-way, an operator must see
where each VM is and move it by hand with the same idempotent operations the agent uses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioning.distribution import Plan, Transfer, routing_tables
from vjob import text_table
from vjob.cli import load_config
from vjob.errors import InputError, VjobError

if TYPE_CHECKING:
    from provisioning.driver import Driver
    from provisioning.images import Catalogue
    from vjob.config import Config

# The catalogue, the driver (libvirt) and the store are imported by the commands when they
# run, so that `vjob image --help` and `vjob vm --help` load none of them (issue 36).


def _action(sub: Any, name: str, help_text: str, description: str, *examples: str) -> argparse.ArgumentParser:
    """One ACTION of `vjob image`/`vjob vm`, with its description and examples (vjob --help's rules)."""
    epilog = "examples:\n" + "".join(f"  {e}\n" for e in examples)
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def register(sub: Any) -> None:
    """`vjob image` and `vjob vm`, each ACTION registered by its own function below."""
    img = _action(
        sub,
        "image",
        "OS image catalogue: build, add, list, remove, verify, distribute",
        "The OS images VMs boot from: the catalogue in the store (name, version, size, sha256, the nodes "
        "holding each) and the files in each node's image_dir.",
        "vjob image build                      # debian12 from Debian packages (~50 s)",
        "vjob image list",
        "vjob image distribute debian12 --nodes node1,node2,node3",
    )
    isub = img.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    for image_action in (
        _image_add_parser,
        _image_build_parser,
        _image_list_parser,
        _image_remove_parser,
        _image_verify_parser,
        _image_distribute_parser,
    ):
        image_action(isub)
    vm = _action(
        sub,
        "vm",
        "VMs on the nodes: list, save, restore, migrate, destroy (debugging)",
        "The VM driver by hand, for debugging: what the agent and the pilots do to a vjob's VM.",
        "vjob vm list",
        "vjob vm save vjob-slurm-42 --node node1",
    )
    vsub = vm.add_subparsers(dest="vm_command", metavar="ACTION", required=True)
    for vm_action in (_vm_list_parser, _vm_save_parser, _vm_restore_parser, _vm_migrate_parser, _vm_destroy_parser):
        vm_action(vsub)


# -- image: the parsers -------------------------------------------------------------------------
def _image_add_parser(isub: Any) -> None:
    add = _action(
        isub,
        "add",
        "copy an image file into the catalogue",
        "Copy a qcow2 or raw disk into the head node's image directory and record it with its sha256.",
        "vjob image add centos7 --file centos7.qcow2 --version 2024.1",
    )
    add.add_argument("name", help="image name: letters, digits, '.', '_', '-'")
    add.add_argument("--file", metavar="FILE", required=True, type=Path, help="qcow2 or raw disk image")
    add.add_argument(
        "--version", metavar="VERSION", default="1", help="version label (default 1): letters, digits, '.', '_', '-'"
    )
    add.set_defaults(func=_image_add)


def _image_build_parser(isub: Any) -> None:
    bld = _action(
        isub,
        "build",
        "build a bootable Debian 12 guest for real jobs (or import one)",
        "Build a Debian 12 guest with the vjob guest agent from Debian packages (mmdebstrap; cached by "
        "content under /var/cache/vjob/images), or import a site's image, and add it to the catalogue.",
        "vjob image build",
        "vjob image build site --packages python3-numpy,build-essential",
        "vjob image build site2 --from site.qcow2",
    )
    bld.add_argument("name", nargs="?", default="debian12", help="image name (default debian12)")
    bld.add_argument("--packages", metavar="LIST", help="comma-separated Debian packages the site's jobs need")
    bld.add_argument(
        "--from",
        metavar="FILE",
        dest="from_file",
        type=Path,
        help="import this qcow2/raw image (ext4 on the whole disk)",
    )
    bld.set_defaults(func=_image_build)


def _image_list_parser(isub: Any) -> None:
    lst = _action(
        isub,
        "list",
        "images, sizes, checksums and the nodes holding them",
        "Every image of the catalogue: version, format, size, sha256 and, per node holding a copy, whether the "
        "whole image is there (disk, kernel, initrd and index at their recorded sizes; `verify` hashes them).",
        "vjob image list",
        "vjob image list --json | jq '.[].name'",
    )
    lst.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    lst.set_defaults(func=_image_list)


def _image_remove_parser(isub: Any) -> None:
    rm = _action(
        isub,
        "remove",
        "forget an image and delete the catalogue's file",
        "Forget an image (all versions unless --version) and delete its files on every node holding it, "
        "the head's last; refused while a VM recorded in the store is built on it. A holder that cannot be "
        "reached stops it before anything is forgotten (run it again), unless --force.",
        "vjob image remove centos7 --version 2024.1",
    )
    rm.add_argument("name", help="image name")
    rm.add_argument("--version", metavar="VERSION", help="only this version (default: all versions)")
    rm.add_argument(
        "--force", action="store_true", help="forget the image even when a holder cannot be reached (its copy stays)"
    )
    rm.set_defaults(func=_image_remove)


def _image_verify_parser(isub: Any) -> None:
    ver = _action(
        isub,
        "verify",
        "recompute checksums; exit 1 on any mismatch",
        "Recompute the sha256 of every copy reachable from here and compare with the catalogue.",
        "vjob image verify",
        "vjob image verify debian12",
    )
    ver.add_argument("name", nargs="?", help="only this image (default: every image)")
    ver.set_defaults(func=_image_verify)


def _image_distribute_parser(isub: Any) -> None:
    dist = _action(
        isub,
        "distribute",
        "send an image down the binary tree to nodes",
        "Copy an image (disk, kernel, initrd, index) to nodes along the binary tree of UBIS III.C (each copy "
        "starts as soon as its source holds the image); every file is checked on arrival against the catalogue "
        "(size, sha256), a file already there is not copied again; the nodes are recorded as holders.",
        "vjob image distribute debian12 --nodes node1,node2,node3,node4",
        "vjob image distribute debian12 --nodes node1,node2 --dry-run",
    )
    dist.add_argument("name", help="image name")
    dist.add_argument("--version", metavar="VERSION", help="this version (default: the newest)")
    dist.add_argument("--nodes", metavar="NODES", required=True, help="comma-separated target nodes")
    dist.add_argument("--dry-run", action="store_true", help="print the transfer plan by round, copy nothing")
    dist.add_argument("--json", action="store_true", help="print the plan as JSON")
    dist.set_defaults(func=_image_distribute)


# -- vm: the parsers ----------------------------------------------------------------------------
def _vm_list_parser(vsub: Any) -> None:
    vl = _action(
        vsub,
        "list",
        "domains on each configured node",
        "The libvirt domains of each configured node with their state.",
        "vjob vm list --node node1",
        "vjob vm list --json",
    )
    vl.add_argument("--node", metavar="NODE", action="append", help="only this node (repeatable)")
    vl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    vl.set_defaults(func=_vm_list)


def _vm_save_parser(vsub: Any) -> None:
    vs = _action(
        vsub,
        "save",
        "suspend a VM to disk (memory state in the snapshot dir)",
        "Save the VM's memory state into the node's snapshot dir (its overlay stays in place); recorded "
        "in the store's snapshots when the store knows the VM.",
        "vjob vm save vjob-slurm-42 --node node1",
    )
    vs.add_argument("vm", help="VM (libvirt domain) name")
    vs.add_argument("--node", metavar="NODE", required=True, help="node the VM runs on")
    vs.set_defaults(func=_vm_save)


def _vm_restore_parser(vsub: Any) -> None:
    vr = _action(
        vsub,
        "restore",
        "resume a saved VM, on its node or on another one",
        "Resume a saved VM; with --from, its state and overlay are copied from that node first.",
        "vjob vm restore vjob-slurm-42 --node node1",
        "vjob vm restore vjob-slurm-42 --node node3 --from node1",
    )
    vr.add_argument("vm", help="VM (libvirt domain) name")
    vr.add_argument("--node", metavar="NODE", required=True, help="node to resume on")
    vr.add_argument("--from", metavar="NODE", dest="from_node", help="node holding the saved state (default: --node)")
    vr.set_defaults(func=_vm_restore)


def _vm_migrate_parser(vsub: Any) -> None:
    vmg = _action(
        vsub,
        "migrate",
        "live-migrate a running VM",
        "Live-migrate a running VM between two nodes (libvirt's migration).",
        "vjob vm migrate vjob-slurm-42 --from node1 --to node2",
    )
    vmg.add_argument("vm", help="VM (libvirt domain) name")
    vmg.add_argument("--from", metavar="NODE", dest="from_node", required=True, help="node the VM runs on")
    vmg.add_argument("--to", metavar="NODE", dest="to_node", required=True, help="node to move it to")
    vmg.set_defaults(func=_vm_migrate)


def _vm_destroy_parser(vsub: Any) -> None:
    vd = _action(
        vsub,
        "destroy",
        "power off and delete a VM, its overlay and saved state",
        "Power the VM off and delete its definition, overlay, job disk and saved state (no way back).",
        "vjob vm destroy vjob-slurm-42 --node node1",
    )
    vd.add_argument("vm", help="VM (libvirt domain) name")
    vd.add_argument("--node", metavar="NODE", required=True, help="node the VM is on")
    vd.set_defaults(func=_vm_destroy)


# -- image ------------------------------------------------------------------------------------
def _catalogue(args: argparse.Namespace) -> Catalogue:
    from provisioning.images import Catalogue  # heavy: sqlalchemy
    from vjob.store.db import open_store  # heavy: sqlalchemy

    cfg = load_config(args)
    return Catalogue(open_store(cfg), cfg.provisioning, data_dir=cfg.data_path)


def _image_add(args: argparse.Namespace) -> int:
    info = _catalogue(args).add(args.name, args.file, version=args.version)
    print(f"image {info.name} version {info.version}: {info.format}, {info.size_bytes} bytes, sha256 {info.sha256}")
    return 0


def _image_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from provisioning import image_build  # heavy: sqlalchemy

    console = Console(stderr=True)
    with console.status(f"building image {args.name}") as status:
        result = image_build.build(
            _catalogue(args), args.name, packages=args.packages, from_file=args.from_file, say=status.update
        )
    print(image_build.describe(result))
    return 0


def _image_list(args: argparse.Namespace) -> int:
    cat = _catalogue(args)
    images = cat.list()
    # Per holder, whether the whole image is there (every file at its recorded size, the index
    # naming this version): a stat per file, over ssh for another host; `verify` hashes them.
    states = {(i.name, i.version): cat.node_states(i, hashed=False) for i in images}
    if args.json:
        rows = [{**vars(i), "nodes": _node_summary(states[i.name, i.version])} for i in images]
        print(json.dumps(rows, indent=1))
        return 0
    cells = []
    for i in images:
        nodes = _node_summary(states[i.name, i.version])
        shown = [f"{n}" + (f" (from {src})" if src else "") + f": {nodes[n]['state']}" for n, src in i.holders.items()]
        cells.append([i.name, i.version, i.format, _size(i.size_bytes), i.sha256[:16], "; ".join(shown)])
    headers = ("name", "version", "format", "size", "sha256", "nodes (received from): whole image?")
    sys.stdout.write(text_table.render("images", headers, cells, text_table.terminal_width(sys.stdout)))
    return 0


def _node_summary(states: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Per node: "whole", "not current" (its index names another version) or what is wrong."""
    out: dict[str, dict[str, Any]] = {}
    for node, files in states.items():
        bad = {role: st for role, st in files.items() if st != "ok"}
        current = [st for st in bad.values() if st.startswith("names version")]
        if not bad:
            state = "whole"
        elif current and len(bad) == 1:
            state = f"whole, not current (index {current[0]})"
        else:
            state = "not whole: " + ", ".join(f"{role} {st}" for role, st in bad.items())
        out[node] = {"whole": not bad or (len(bad) == 1 and bool(current)), "state": state, "files": files}
    return out


def _image_remove(args: argparse.Namespace) -> int:
    for done in _catalogue(args).remove(args.name, version=args.version, force=args.force):
        info = done.info
        also = f"; from {', '.join(done.nodes)}" if done.nodes else ""
        print(f"removed image {info.name} version {info.version} ({info.path}{also})")
        for node, why in sorted(done.left.items()):
            print(f"warning: node {node} not reached, forgotten anyway (--force): {why}", file=sys.stderr)
    return 0


def _image_verify(args: argparse.Namespace) -> int:
    problems = _catalogue(args).verify(args.name)
    for p in problems:
        print(p)
    if problems:
        raise VjobError(f"{len(problems)} image problem(s)")
    print("all image checksums match")
    return 0


def _image_distribute(args: argparse.Namespace) -> int:
    cat = _catalogue(args)
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    if not nodes:
        raise InputError(f"--nodes {args.nodes!r}: give at least one node name")
    if args.dry_run:
        plan = cat.plan(args.name, nodes, version=args.version)
        _print_plan(plan, args.json)
        return 0
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(f"distributing {args.name}") as status:
        copied: dict[str, list[str]] = {}

        def progress(t: Transfer, files: list[str]) -> None:
            copied[t.target] = files
            status.update(f"round {t.round}: {t.source} -> {t.target} done")

        started = time.monotonic()
        plan = cat.distribute(args.name, nodes, version=args.version, on_transfer=progress)
    _print_plan(plan, args.json, copied)
    info = cat.get(args.name, args.version)
    tables = routing_tables(plan.tree, info.holders)
    if not args.json:
        for node, table in sorted(tables.items()):
            print(f"routing table of {node}: " + ", ".join(f"{h} via {nxt}" for h, nxt in sorted(table.items())))
        files = sum(len(f) for f in copied.values())
        took = time.monotonic() - started
        print(f"{len(plan.transfers)} node(s) in {plan.rounds} round(s), {files} file(s) copied, {took:.2f} s")
    return 0


def _print_plan(plan: Plan, as_json: bool, copied: dict[str, list[str]] | None = None) -> None:
    """The plan; after a distribution (`copied`), what each copy carried (nothing: the node
    held the whole image already)."""
    done = copied or {}
    if as_json:
        print(
            json.dumps(
                {
                    "image": plan.image,
                    "tree": list(plan.tree.nodes),
                    "already": list(plan.already),
                    "rounds": [
                        [
                            {"source": t.source, "target": t.target, "route": list(t.route)}
                            | ({"copied": done[t.target]} if t.target in done else {})
                            for t in ts
                        ]
                        for _r, ts in sorted(plan.by_round().items())
                    ],
                },
                indent=1,
            )
        )
        return
    print(f"image {plan.image}, tree in heap order: {' '.join(plan.tree.nodes)}")
    if plan.already:
        print(f"already there: {', '.join(plan.already)}")
    for rnd, transfers in sorted(plan.by_round().items()):
        for t in transfers:
            carried = ""
            if t.target in done:
                files = ", ".join(done[t.target])
                carried = f"   copied: {files}" if files else "   whole already: nothing copied"
            print(f"round {rnd}: {t.source} -> {t.target}   via {' > '.join(t.route)}{carried}")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} B"


# -- vm ---------------------------------------------------------------------------------------
def _driver(args: argparse.Namespace) -> tuple[Config, Driver]:
    from provisioning.driver import Driver  # heavy: libvirt
    from vjob.store.db import open_store  # heavy: sqlalchemy

    cfg = load_config(args)
    return cfg, Driver(cfg.provisioning, data_dir=cfg.data_path, store=open_store(cfg))


def _vm_list(args: argparse.Namespace) -> int:
    cfg, drv = _driver(args)
    nodes = args.node or sorted(cfg.provisioning.nodes) or ["localhost"]
    rows = []
    with drv:
        for node in nodes:
            try:
                rows.extend(drv.list_vms(node))
            except VjobError as exc:
                print(f"vjob: warning: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps([{**vars(r), "state": r.state.value} for r in rows], indent=1))
        return 0
    # Plain aligned columns (vjob.text_table, as `vjob status`): full headers in 80 columns, no
    # box drawing in a pipe.
    cells = [
        [r.node, r.name, r.state.value, f"{r.memory_mib} MiB", r.vcpus, "yes" if r.persistent else "no"] for r in rows
    ]
    headers = ("node", "VM", "state", "memory", "vCPUs", "persistent")
    sys.stdout.write(text_table.render("VMs", headers, cells, text_table.terminal_width(sys.stdout)))
    return 0


def _vm_save(args: argparse.Namespace) -> int:
    _cfg, drv = _driver(args)
    with drv:
        snap = drv.save(args.vm, args.node)
    print(
        f"VM {args.vm} saved on {args.node}: {snap.memory_path} ({_size(snap.size_bytes)}, sha256 {snap.sha256[:16]})"
    )
    return 0


def _vm_restore(args: argparse.Namespace) -> int:
    _cfg, drv = _driver(args)
    with drv:
        drv.restore(args.vm, args.node, from_node=args.from_node)
    print(f"VM {args.vm} running on {args.node}")
    return 0


def _vm_migrate(args: argparse.Namespace) -> int:
    _cfg, drv = _driver(args)
    with drv:
        drv.migrate(args.vm, args.from_node, args.to_node)
    print(f"VM {args.vm} migrated {args.from_node} -> {args.to_node}")
    return 0


def _vm_destroy(args: argparse.Namespace) -> int:
    _cfg, drv = _driver(args)
    with drv:
        drv.delete(args.vm, args.node)
    print(f"VM {args.vm} destroyed on {args.node}")
    return 0
