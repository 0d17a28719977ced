"""Preemption: victim selection, the Entropy context-switch planner and its cost model, the
plan executor, deadline-aware admission and heterogeneity remapping.

Deadline-aware admission and continuation (issue 19; docs/deadline.md) are the pure functions of
`preemption.deadline`: the x-factor, static / adaptive (eq. 2, bounded) / cdf thresholds, the
continue-checkpoint-cancel decision, the VO model and its fit, the training search, and the
threshold file the agent publishes for the submit hooks (`preemption.deadline.threshold_file`).

Heterogeneity remapping (issue 20; docs/remap.md) is `preemption.remap`: ARRIVE-F's performance
models and its move/swap decisions, pure functions used by the simulator's heterogeneous replay
(`vjob simulate --subclusters`) and by the agent's live remapping (agent.remap_step, `[remap]
farm_file`: one-VM vjobs swapped between sub-clusters by live migration, `preemption.remap.live`).

The cluster-wide context switch (issue 6; docs/planner.md), for the agent and the simulator:

    from preemption.planner import Instance, NodeSpec, VMSpec, instance_from_view, make_plan, validate
    from preemption.decisions import fcfs_selection, ubis_selection
    from preemption.executor import Executor, ActionPerformer

    inst = Instance(nodes=(NodeSpec("n1", cpu=2, mem=4096), ...),
                    vms=(VMSpec("v1", vjob="j1", cpu=1, mem=512,
                                state=VJobState.RUNNING, host="n1"), ...),
                    target={"j1": VJobState.SLEEPING, ...})   # or Instance.from_dict(json)
    inst = instance_from_view(view, target={...})  # from a ClusterView (usable nodes, VMs by job)
    # Decision modules (pure): which vjobs run next -> Selection(target, placement).
    sel = fcfs_selection(inst, queue=["j3", "j1", ...])          # FCFS order, first = first served
    sel = ubis_selection(inst, priorities={"j1": 0.42, ...})     # highest priority first
    target = sel.target                                          # vjob -> VJobState
    plan = make_plan(inst.with_target(target), optimizer="cpsat", time_limit_s=10,
                     hint=sel.placement)                         # hint optional: a known viable placement
    plan.pools        # tuple of pools, each a tuple of PlanAction(kind, vm, vjob, src, dst)
    plan.placement    # vm -> node for every VM running at the end
    plan.cost         # Entropy cost model; plan.to_dict() is the plan JSON of docs/planner.md
    validate(inst.with_target(target), plan)   # raises PlanInvalidError (make_plan already did)

    # Errors: vjob.errors.InputError for a bad instance (names the entry), NoViablePlacementError
    # (an InputError) when the target cannot fit (names the short resource and the nodes).

    performer = provisioning.performer.DriverPerformer(driver, spec_for)  # the real VM driver
    report = Executor(performer, store).execute(plan, reason="interactive job 42")
    # performer implements ActionPerformer: run(vm, node), stop(vm, node), suspend(vm, node),
    # resume(vm, node, source), migrate(vm, source, destination); each raises on failure.
    # Every action is journalled in the store's switches/actions tables before and after it
    # runs; pools run one after the other, the actions of a pool in parallel, the suspends and
    # resumes of one vjob pipelined one per second sorted by host. The executor stops at the
    # first pool with a failure: report.state ("done"/"failed"), report.done, report.failed,
    # report.not_started, report.switch_id.
"""
