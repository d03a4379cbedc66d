from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from nodes.wheelhouse import Target, WheelhouseError, all_targets, build, this_machine


def parse_target(text):
    """'3.11-x86_64' -> Target."""
    python, _, machine = text.partition("-")
    if not python or not machine:
        raise CommandError(f"a target is PYTHON-MACHINE, e.g. 3.11-x86_64; got {text!r}")
    return Target(python, machine)


class Command(BaseCommand):
    help = ("Build the agent's wheelhouse, served at /agent/wheels/ for nodes with no package "
            "index: the agent's wheel from agent/ and its dependencies' wheels for each target "
            "Python and machine (nodes/wheelhouse.py). Run at install and upgrade time, where "
            "a package index is reachable.")

    def add_arguments(self, parser):
        parser.add_argument("--dir", default=str(settings.CLUSTERUI_AGENT_WHEELHOUSE),
                            help="where (default CLUSTERUI_AGENT_WHEELHOUSE)")
        parser.add_argument("--targets", default="all",
                            help="'all' (CPython 3.9-3.13 on x86_64 and aarch64), 'here' (this "
                                 "machine's), or a comma-separated list like 3.9-x86_64,3.12-aarch64")

    def handle(self, *args, dir, targets, **options):
        if targets == "all":
            chosen = all_targets()
        elif targets == "here":
            chosen = [this_machine()]
        else:
            chosen = [parse_target(text.strip()) for text in targets.split(",") if text.strip()]
        try:
            manifest = build(dir, chosen, log=self.stdout.write)
        except WheelhouseError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(
            f"{dir}: clusterui-agent {manifest['agent_version']} and "
            f"{len(manifest['files']) - 1} dependency wheels for {len(chosen)} targets"))
