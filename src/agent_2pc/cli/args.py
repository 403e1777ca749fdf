"""A small declarative argument parser for the CLI.

Agents call the CLI on every step, so start-up time matters: argparse costs about 3 ms here
(gettext, and shutil for its help formatter). The contract's surface is small and regular
(``--name value`` options, flags, repeatable options, ``--`` for a command line), so this parser
is enough, and it lets ``--json`` and ``--root`` stand before or after the command name.

Values are taken literally: ``--old --json`` sets ``old`` to ``"--json"``; ``--opt=value`` works
too.
"""

from __future__ import annotations

from ..errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

VALUE, FLAG, MULTI = "value", "flag", "multi"


class Opt:
    """An option: ``--flag`` with a value (VALUE), without one (FLAG), or repeatable (MULTI)."""

    __slots__ = ("flag", "kind", "required", "help", "metavar", "type", "dest", "short")

    def __init__(self, flag: str, kind: str = VALUE, required: bool = False, help: str = "",
                 metavar: str = "", type: Callable[[str], Any] | None = None,
                 short: str | None = None) -> None:
        self.flag = flag
        self.short = short  # a one-letter alias, "-m" (git's habit for a few options)
        self.kind = kind
        self.required = required
        self.help = help
        self.metavar = metavar
        self.type = type
        self.dest = flag.lstrip("-").replace("-", "_")


class Command:
    """A command (or a group of subcommands). ``run(ctx, args)`` returns the result dict."""

    __slots__ = ("name", "summary", "run", "opts", "positionals", "takes_rest", "one_of",
                 "subcommands", "epilog", "extra")

    def __init__(self, name: str, summary: str, run: Callable[..., Any] | None = None,
                 opts: tuple[Opt, ...] = (),
                 positionals: tuple[tuple[str, str], ...] = (), takes_rest: bool = False,
                 one_of: tuple[tuple[str, ...], ...] = (),
                 subcommands: tuple[Command, ...] = (), epilog: str = "",
                 extra: dict[str, Any] | None = None) -> None:
        self.name = name
        self.summary = summary
        self.run = run
        self.opts = opts
        # (name, help) in order; a last name ending in "..." takes the rest.
        self.positionals = positionals
        self.takes_rest = takes_rest  # everything after "--" goes to args["argv"]
        # Each group: exactly one of these dests must be given (content | from_file | stdin).
        self.one_of = one_of
        self.subcommands = subcommands
        self.epilog = epilog
        self.extra = extra or {}


GLOBAL_OPTS = (
    Opt("--json", FLAG, help="print exactly one JSON object on stdout"),
    Opt("--root", VALUE, metavar="DIR", help="the workspace root (default: $AGENT2PC_ROOT, "
        "else the nearest ancestor holding .agent-tx/)"),
    Opt("--no-daemon", FLAG, help="work in this process even when a daemon serves the "
        "workspace (docs/daemon.md)"),
)


class HelpRequested(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def int_arg(value: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise UsageError(f"not a whole number: {value!r}") from None


def parse(argv: list[str], commands: tuple[Command, ...], prog: str = "agent-2pc"
          ) -> tuple[list[Command], dict[str, Any]]:
    """Parse ``argv``; return the command path (outermost first) and the options.

    Raises UsageError for bad input and HelpRequested when ``-h``/``--help`` is asked for.
    """
    args: dict[str, Any] = {"json": False, "root": None, "no_daemon": False}
    path: list[Command] = []
    table = {c.name: c for c in commands}
    opts = {o.flag: o for o in GLOBAL_OPTS}
    positional: list[str] = []
    want_help = False
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok == "--":
            if path and path[-1].takes_rest:
                args["argv"] = argv[i:]
                break
            raise UsageError("'--' is only accepted by commands that run a command line")
        if tok in ("-h", "--help"):
            want_help = True
            continue
        if tok.startswith("--") or (tok.startswith("-") and tok in opts):
            flag, eq, inline = tok.partition("=")
            opt = opts.get(flag)
            if opt is None:
                where = f" for '{' '.join(c.name for c in path)}'" if path else ""
                raise UsageError(f"unknown option {flag}{where}")
            if opt.kind == FLAG:
                if eq:
                    raise UsageError(f"{flag} takes no value")
                args[opt.dest] = True
                continue
            if eq:
                value = inline
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise UsageError(f"{flag} needs a value")
            converted = opt.type(value) if opt.type else value
            if opt.kind == MULTI:
                args.setdefault(opt.dest, []).append(converted)
            else:
                args[opt.dest] = converted
            continue
        if not path or path[-1].subcommands:
            cmd = table.get(tok)
            if cmd is None:
                if not path:
                    raise UsageError(f"unknown command {tok!r}; see '{prog} --help'")
                raise UsageError(f"unknown command '{path[-1].name} {tok}'")
            path.append(cmd)
            table = {c.name: c for c in cmd.subcommands}
            opts = {o.flag: o for o in GLOBAL_OPTS}
            opts.update({k: o for o in cmd.opts for k in (o.flag, o.short) if k})
            continue
        positional.append(tok)

    if want_help:
        raise HelpRequested(help_text(path, commands, prog))
    if not path:
        raise UsageError(f"no command given; see '{prog} --help'")
    cmd = path[-1]
    if cmd.subcommands and cmd.run is None:
        raise UsageError(f"'{cmd.name}' needs a subcommand: "
                         + ", ".join(c.name for c in cmd.subcommands))
    names = [p for p, _ in cmd.positionals]
    if names and names[-1].endswith("..."):
        args[names[-1].rstrip(".")] = positional[len(names) - 1:]
        names = names[:-1]
    elif len(positional) > len(names):
        raise UsageError(f"unexpected argument {positional[len(names)]!r}")
    for idx, name in enumerate(names):
        if idx >= len(positional):
            raise UsageError(f"'{cmd.name}' needs {name.upper()}")
        args[name] = positional[idx]
    for opt in cmd.opts:
        if opt.required and opt.dest not in args:
            raise UsageError(f"'{cmd.name}' needs {opt.flag}")
        if opt.kind == FLAG:
            args.setdefault(opt.dest, False)
        elif opt.kind == MULTI:
            args.setdefault(opt.dest, [])
        else:
            args.setdefault(opt.dest, None)
    for group in cmd.one_of:
        given = [d for d in group if args.get(d) not in (None, False)]
        flags = " | ".join("--" + d.replace("_", "-") for d in group)
        if len(given) != 1:
            raise UsageError(f"'{cmd.name}' needs exactly one of {flags}")
    if cmd.takes_rest:
        args.setdefault("argv", [])
    return path, args


def help_text(path: list[Command], commands: tuple[Command, ...], prog: str) -> str:
    if not path:
        width = max(len(c.name) for c in commands)
        lines = [f"usage: {prog} [--root DIR] COMMAND [OPTIONS] [--json]", "",
                 "Transactions for coding agents: stage, verify, commit atomically, recover.", "",
                 "commands:"]
        lines += [f"  {c.name:<{width}}  {c.summary}" for c in commands]
        lines += ["", f"'{prog} COMMAND --help' describes one command."]
        return "\n".join(lines) + "\n"
    cmd = path[-1]
    name = " ".join(c.name for c in path)
    usage = [f"usage: {prog} {name}"]
    if cmd.subcommands:
        usage.append("[SUBCOMMAND]" if cmd.run is not None else "SUBCOMMAND")
    for pos, _ in cmd.positionals:
        usage.append(pos.upper())
    for o in cmd.opts:
        part = o.flag if o.kind == FLAG else f"{o.flag} {o.metavar or o.dest.upper()}"
        if o.kind == MULTI:
            part += "..."
        usage.append(part if o.required else f"[{part}]")
    if cmd.takes_rest:
        usage.append("-- CMD [ARGS...]")
    lines = [" ".join(usage), "", cmd.summary]
    if cmd.subcommands:
        width = max(len(c.name) for c in cmd.subcommands)
        lines += ["", "subcommands:"]
        lines += [f"  {c.name:<{width}}  {c.summary}" for c in cmd.subcommands]
    all_opts = list(cmd.opts) + list(GLOBAL_OPTS)
    if cmd.positionals:
        lines += ["", "arguments:"]
        lines += [f"  {p.upper():<22} {h}" for p, h in cmd.positionals]
    lines += ["", "options:"]
    for o in all_opts:
        left = o.flag if o.kind == FLAG else f"{o.flag} {o.metavar or o.dest.upper()}"
        lines.append(f"  {left:<22} {o.help}")
    if cmd.epilog:
        lines += ["", cmd.epilog]
    return "\n".join(lines) + "\n"
