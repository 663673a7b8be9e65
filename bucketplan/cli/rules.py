"""The rules every command applies to its flags, each one table: which workloads a flag shapes
(``SHAPING_FLAGS``: refused beside a workload it shapes nothing of, never ignored) and which
flags need or exclude others (``COMBINATIONS``: `solve` and `solve-dir` refuse alike).

Imports only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

from bucketplan.cli.common import CLIError

# the args attribute that lists the shaping flags the user gave (``noted``)
GIVEN = "given_flags"


def noted(s, kind: str = "store"):
    """argparse's ``kind`` action that also notes its flag as given: a default cannot tell
    ``--preset h100-8nodes`` from no --preset, and a flag given where it shapes nothing is refused."""
    base = s._registry_get("action", kind)

    class Noted(base):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {self.dest})

    return Noted


# Where a workload comes from, as the rules below name it
BUILT_IN, FACTORY, HF, GRAPH, PROBLEM = "built-in", "--model", "--hf-config/--hf", "--graph", "problem file"
TRACED = (BUILT_IN, FACTORY, HF, GRAPH)
# what each source carries, so that a flag is refused with the reason it shapes nothing there
CARRIES = {
    BUILT_IN: "carries its depth, parallelism and groups in its name",
    FACTORY: "builds its own process groups",
    HF: "builds its own process groups",
    GRAPH: "carries its groups, depth and parallelism",
    PROBLEM: "was extracted already: it carries its graph, cluster and costs (extract the workload again "
             "with {flag})",
}


@dataclass(frozen=True)
class Shaping:
    """A flag that shapes a workload: the sources it ``applies_to``, and what it is (the start of
    its refusal). ``every_target``: it shapes every workload of the command (the cluster, torch's
    pipeline); else only the one --model, --hf-config, --hf or --graph gives."""

    dest: str
    applies_to: tuple[str, ...]
    what: str
    every_target: bool = True


_CLUSTER = "shapes a workload as it is traced and priced"
# Every flag that shapes a workload, in one table that every command applies (``check_shaping``):
# a flag given beside a workload it does not apply to is refused, naming it, never ignored.
SHAPING_FLAGS = {
    "--layers": Shaping("layers", (FACTORY, HF), "applies to --model, --hf-config and --hf", every_target=False),
    "--parallel": Shaping("parallel", (FACTORY, HF), "applies to --model, --hf-config and --hf",
                          every_target=False),
    "--group": Shaping("group", (GRAPH,), "names the process groups of a --graph file", every_target=False),
    **{flag: Shaping(flag[2:].replace("-", "_"), TRACED, _CLUSTER)
       for flag in ("--preset", "--ranks", "--tp", "--collectives", "--collective-ranks", "--compute-tflops",
                    "--hbm-tbps", "--contention", "--profile", "--profile-cpu", "--pre-bucketing", "--schedule", "--bucket-mode",
                    "--max-bucket-memory-gb", "--hardware")},
}


def given(args, flag: str) -> bool:
    """Whether the user gave a flag of ``SHAPING_FLAGS`` (its value may equal its default)."""
    return SHAPING_FLAGS[flag].dest in getattr(args, GIVEN, ())


def check_shaping(args, own: tuple[str, str] | None, others: list[tuple[str, str]] = ()) -> None:
    """Refuse a shaping flag given beside a workload it shapes nothing of, in one line naming
    both. ``own``: (source, name) of the workload --model, --hf-config, --hf or --graph gives;
    ``others``: the command's other targets (built-in names, problem files). A flag of one
    workload (--layers, --parallel, --group) is checked against ``own``, or, without one,
    against the others; a cluster or pipeline flag against every target."""
    for flag, rule in SHAPING_FLAGS.items():
        if not given(args, flag):
            continue
        reach = [own] if own is not None and not rule.every_target else [*([own] if own else []), *others]
        for source, name in reach:
            if source not in rule.applies_to:
                shown = {BUILT_IN: f"built-in workload {name}", PROBLEM: f"problem file {name}"}.get(
                    source, f"{source} {name}")
                raise CLIError(f"{flag} {rule.what}, and {shown} {CARRIES[source].format(flag=flag)}")


def target_source(target: str) -> str:
    """A positional target's source: a problem file (``*.json``) or a built-in name."""
    return PROBLEM if target.endswith(".json") else BUILT_IN


@dataclass(frozen=True)
class Setting:
    """A flag as a rule reads it: ``dest`` given (``value`` None: any value but the unset ones) or
    set to ``value``; ``shown`` as the messages write it."""

    shown: str
    dest: str
    value: object = None

    def holds(self, args) -> bool:
        v = getattr(args, self.dest)
        return (v is not None and v is not False) if self.value is None else v == self.value


@dataclass(frozen=True)
class Combination:
    """``flag`` given needs ``other`` (``needs``) or excludes it; ``message`` is the refusal."""

    flag: Setting
    other: Setting
    needs: bool
    message: str

    def broken(self, args) -> bool:
        return self.flag.holds(args) and self.other.holds(args) != self.needs


_FREE, _STEP = Setting("--positions free", "positions", "free"), Setting("--objective step", "objective", "step")
# The flags that need or exclude others, one table for every command (``check_combinations``): a
# command applies each rule whose flags it has, so `solve` and `solve-dir` refuse alike.
COMBINATIONS = (
    Combination(_FREE, _STEP, True,
                "--positions free needs --objective step (positions are chosen by the simulated step)"),
    Combination(Setting("--peak-memory-gb", "peak_memory_gb"), _FREE, True, "--peak-memory-gb needs --positions free"),
    Combination(Setting("--keep-overlap", "keep_overlap"), _FREE, True,
                "--keep-overlap needs --positions free (anchored plans always keep torch's overlap)"),
    Combination(Setting("--prove", "prove"), _FREE, True,
                "--prove needs --positions free (an anchored solve proves its bound itself)"),
    Combination(Setting("--prove", "prove"), Setting("--keep-overlap", "keep_overlap"), False,
                "--prove does not keep torch's overlap (its model prices lost overlap): drop --keep-overlap "
                "or --prove"),
)


def check_combinations(args) -> None:
    """Refuse the first rule of ``COMBINATIONS`` the flags break, among those whose flags the
    command has."""
    for rule in COMBINATIONS:
        if all(hasattr(args, x.dest) for x in (rule.flag, rule.other)) and rule.broken(args):
            raise CLIError(rule.message)
