"""Network and parallel filesystems as the sweep sees them: the mount that
holds the swap directory, a named set of client knob values (a variant),
and the exact commands that set and restore them (a plan). Plain data;
fs.netfs finds mounts and makes plans, sweep.netfs runs them."""

from __future__ import annotations

from dataclasses import dataclass

# fstype in /proc/self/mountinfo -> the family whose knobs apply
NETFS_FAMILIES = {"lustre": "lustre", "nfs": "nfs", "nfs4": "nfs"}


@dataclass(frozen=True)
class NetMount:
    """A mounted filesystem (one line of /proc/self/mountinfo)."""

    mount_point: str
    fstype: str
    source: str                          # lustre: MGS@net:/fsname; nfs: server:/export
    options: tuple[str, ...]             # per-mount and superblock options, in mountinfo's order
    root: str = "/"                      # the part of the source mounted here (bind mounts)

    @property
    def family(self) -> str | None:
        """"lustre", "nfs", or None for a filesystem without client knobs here."""
        return NETFS_FAMILIES.get(self.fstype)

    def option(self, name: str) -> str | None:
        """The value of `name=value` among the options (None: not set)."""
        for opt in self.options:
            key, _, value = opt.partition("=")
            if key == name:
                return value
        return None


@dataclass(frozen=True)
class KnobVariant:
    """One point of the filesystem-knob dimension: a label and its settings
    (knob name -> value, as the client takes it). No settings: the mount as
    it is, the reference every other variant is compared with."""

    label: str
    settings: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings) or "as mounted"


@dataclass(frozen=True)
class KnobPlan:
    """What one variant runs: `apply` before its trials (in order), `restore`
    after them (always, also on failure or Ctrl-C), and the directory the
    trials use (for NFS, the same path on a scratch mount of the export)."""

    variant: KnobVariant
    family: str
    target_dir: str
    apply: tuple[tuple[str, ...], ...]
    restore: tuple[tuple[str, ...], ...]
    note: str = ""

    def commands(self) -> list[str]:
        """Shell-quoted lines, as --dry-run prints them."""
        import shlex

        return ([shlex.join(c) for c in self.apply] + ["# ... the variant's trials run in " + self.target_dir]
                + [shlex.join(c) for c in self.restore])
