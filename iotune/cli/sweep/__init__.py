"""`iotune sweep`: one subcommand per kind of tuning (aio, offload,
checkpoint, layouts, netfs) over the sweep spine. Bare `iotune sweep` is the
aio sweep; the spellings of the single command it was (`--offload`,
`--checkpoint`, `--layouts N`, `--netfs`) still work for one release."""

from __future__ import annotations

import click

from ..options import say
from . import aio, checkpoint, layouts, offload      # the modules stay reachable by name (monkeypatch, tests)
from .groups import OLD_MODE_FLAGS

DEFAULT = "aio"


class SweepGroup(click.Group):
    """Subcommands in the order they are taught; arguments that name none
    go to the aio sweep; a subcommand named after options is an error that
    shows the right order."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and (args[0] in self.commands or args[0] in ctx.help_option_names):
            return super().parse_args(ctx, args)
        args = self.old_spelling(ctx, list(args))
        if not args or args[0] not in self.commands:
            self.refuse_late_subcommand(ctx, args)
            args = [DEFAULT, *args]
        return super().parse_args(ctx, args)

    def old_spelling(self, ctx: click.Context, args: list[str]) -> list[str]:
        """`sweep offload …` as `sweep offload …` (and --checkpoint,
        --layouts N, --netfs), with a one-line deprecation note."""
        words = self.words(args)
        found = [(i, w.split("=", 1)[0]) for i, w in words if w.split("=", 1)[0] in OLD_MODE_FLAGS]
        if not found:
            return args
        if len(found) > 1:
            raise click.UsageError(f"{found[0][1]} and {found[1][1]} are two sweeps: run one, then the other",
                                   ctx)
        i, flag = found[0]
        sub = OLD_MODE_FLAGS[flag]
        rest = args[:i] + args[i + 1:]
        if flag == "--layouts":                  # --layouts N took the number of drives
            value = args[i].split("=", 1)[1] if "=" in args[i] else (args[i + 1] if i + 1 < len(args) else "")
            rest = args[:i] + ["--drives", value] + args[i + (1 if "=" in args[i] else 2):]
        say(f"warning: `iotune sweep {flag}` is deprecated and will be removed in the next release: use "
            f"`iotune sweep {sub}`")
        return [sub, *rest]

    def words(self, args: list[str]) -> list[tuple[int, str]]:
        """(index, token) of the tokens that are not option values, as the aio
        sweep (and the old single command) would parse them."""
        takes_value = {o for p in self.every_option() if not p.is_flag and not p.count
                       for o in (*p.opts, *p.secondary_opts)}
        out, skip = [], False
        for i, token in enumerate(args):
            if skip:
                skip = False
                continue
            if token == "--":
                break
            out.append((i, token))
            skip = token in takes_value or token == "--layouts"      # the old spelling took N
        return out

    def every_option(self) -> list[click.Option]:
        return [p for cmd in self.commands.values() for p in cmd.params if isinstance(p, click.Option)]

    def refuse_late_subcommand(self, ctx: click.Context, args: list[str]) -> None:
        late = next((w for _, w in self.words(args) if w in self.commands), None)
        if late is not None:
            rest = [a for a in args if a != late]
            raise click.UsageError(f"`{late}` is a subcommand: name it first, then its options: "
                                   f"iotune sweep {late} {' '.join(rest)}".rstrip(), ctx)


@click.group("sweep", cls=SweepGroup)
def sweep() -> None:
    """Tune a drive or a job, one kind of tuning per subcommand; bare
    `iotune sweep` is `iotune sweep aio`.

    Each subcommand has its own options: `iotune sweep SUBCOMMAND --help`.
    Every trial is journaled as it ends; Ctrl-C, then the same command,
    resumes. --apply writes only what the sweep decided into a copy of your
    config, and prints the change as a diff.

    \b
    Examples:
      sudo iotune sweep                                  the aio sweep on a built-in emulated drive
      sudo iotune sweep aio --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --apply ds_config.json
      sudo iotune sweep offload --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}"
      sudo iotune sweep checkpoint --path /mnt/nvme/swap --model tiny
      sudo iotune sweep layouts --drives 3 --filesystems xfs,btrfs
    """


SHORT = {aio.aio: "DeepSpeed's aio block for a drive (fio or aio_handle), confirmed on training steps",
         offload.offload: "the whole offload block of your job, within the host's memory",
         checkpoint.checkpoint: "how your job saves and loads checkpoints, each restore checked",
         layouts.layouts: "RAID0 and filesystems over scratch drives, ranked on one scale",
         layouts.netfs: "a network filesystem's client knobs (Lustre, NFS)"}
for command, short in SHORT.items():
    command.short_help = short
    sweep.add_command(command)
