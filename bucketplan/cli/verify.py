"""``bucketplan verify``: check a plan against the rules of planner/README.md, under the policy
it records (or the flags'), and report; exit 1 if infeasible."""

from __future__ import annotations

import argparse
import sys

from bucketplan.cli.common import GB, CLIError, gigabytes, memory_line, overlap_line


def add_parser(sub) -> None:
    s = sub.add_parser("verify", help="check a plan against the rules of planner/README.md (exit 1 "
                                      "if infeasible)")
    s.add_argument("problem", help="the problem file (problem.json, as `extract` writes it)")
    s.add_argument("plan", help="the plan file to check (plan.json, as `solve` writes it)")
    s.add_argument("--max-violations", type=int, default=20,
                   help="violations to print (default %(default)s)")
    # default None: not given, so the policy the plan records (or the default one) applies
    s.add_argument("--protect-partly", action=argparse.BooleanOptionalAction, default=None,
                   help="check under the stricter policy that keeps partly hidden overlap too "
                        "(--no-protect-partly: torch's); default: the policy the plan records in "
                        "its params, else torch's")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--memory-budget-gb", type=float, default=None,
                   help="check rule 10 with this budget (GB = 10^9 bytes); default: the budget "
                        "the plan records (in bytes), else none")
    g.add_argument("--no-memory-budget", action="store_true", help="check without a memory budget")
    s.set_defaults(func=run)


def run(args) -> int:
    try:
        return _verify_and_report(args)
    except KeyboardInterrupt:  # loading or checking a large problem takes seconds
        print("bucketplan verify: interrupted before the check was complete", file=sys.stderr)
        return 130


def _verify_and_report(args) -> int:
    """Check the plan under its recorded policy (or the flags'), report."""
    import planner
    from planner.rules.verifier import check

    # the policy flags are checked before anything is loaded, as solve's
    given: dict = {}
    if args.protect_partly is not None:
        given["protect_partly"] = args.protect_partly
    if args.memory_budget_gb is not None:
        given["memory_budget_bytes"] = gigabytes(args.memory_budget_gb, "--memory-budget-gb", zero_ok=True)
    elif args.no_memory_budget:
        given["memory_budget_bytes"] = None
    problem = planner.load_problem(args.problem)
    plan = planner.load_plan(args.plan)
    policy, source, recorded = _policy(args, plan, given)
    # verify has no overlap flag: a positioned step plan records keep_overlap false (rules 4, 7
    # and 8 judge torch's order, which such a plan leaves) unless searched with --keep-overlap
    overlap = recorded.get("keep_overlap", True)
    peak = recorded.get("peak_memory_bytes")  # rule 11, as the positioned search recorded it
    report = check(problem, plan, **policy, keep_overlap=overlap, peak_memory_bytes=peak)
    for v in report.violations[: args.max_violations]:
        print(v)
    if len(report.violations) > args.max_violations:
        print(f"... and {len(report.violations) - args.max_violations} more violations")
    print(f"plan                {args.plan} ({plan.planner})")
    _print_policy(policy, source)
    _print_report(problem, report, policy)
    if not overlap:
        print("overlap rules       4, 7 and 8 off (keep_overlap false, recorded in the plan)")
    if peak is not None:
        print(f"peak budget         {peak / GB:.3f} GB (rule 11, recorded in the plan)")
    if not any(v.rule in (1, 5) for v in report.violations):  # memory needs a well-formed plan
        print(memory_line(problem, plan))
    return 0 if report.feasible else 1


def _policy(args, plan, given: dict) -> tuple[dict, dict, dict]:
    """The policy a plan is checked under, where each part came from, and what the plan records.

    A plan is checked under the policy it was made for (solve records it in params): a plan
    solved with --protect-partly or a budget judged by the default rules would pass where it
    should not, or the reverse; a flag overrides what the plan says."""
    from planner.rules.verifier import recorded_policy

    try:
        recorded = recorded_policy(plan, ignore=given)
    except ValueError as e:
        raise CLIError(f"{args.plan}: {e}") from None
    policy = {"protect_partly": False, "memory_budget_bytes": None}
    source = dict.fromkeys(policy, "default")
    for key in policy:
        if key in given:
            policy[key], source[key] = given[key], "from flags"
        elif key in recorded:
            policy[key], source[key] = recorded[key], "recorded in the plan"
    return policy, source, recorded


def _print_policy(policy: dict, source: dict) -> None:
    budget = policy["memory_budget_bytes"]
    parts = {"protect_partly": f"protect_partly={policy['protect_partly']}",
             "memory_budget_bytes": "memory budget " + (
                 "none" if budget is None else f"{budget / GB:g} GB ({budget} bytes)")}
    if len(set(source.values())) == 1:
        print(f"policy              {', '.join(parts.values())} ({source['protect_partly']})")
    else:
        print("policy              "
              + ", ".join(f"{text} ({source[key]})" for key, text in parts.items()))


def _print_report(problem, report, policy: dict) -> None:
    q = report.quality
    by_rule = ": by rule " + str(report.by_rule()) if report.violations else ""
    print(f"feasible            {'yes' if report.feasible else 'NO'} "
          f"({len(report.violations)} violations{by_rule})")
    print(f"collectives         {q.collectives_before} -> {q.collectives_after} "
          f"({q.buckets} merged buckets)")
    print(overlap_line(problem))
    print(f"overlap kept        {q.hidden_kept}/{q.hidden_relations} (collective, hiding compute) "
          f"pairs of fully hidden collectives; {q.partly_kept}/{q.partly_relations} of partly "
          "hidden ones " + ("(protected: protect_partly)" if policy["protect_partly"]
                            else "(not protected, as in torch)"))
