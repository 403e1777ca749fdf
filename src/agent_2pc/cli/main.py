"""Entry point of the ``agent-2pc`` command: parse, call the library, render.

No business logic lives here; see commands.py for the command table.
"""

from __future__ import annotations

import sys

from ..errors import Agent2PCError, IoFailed, UsageError
from .args import HelpRequested, parse
from .output import emit, emit_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..coordinator.client import Agent2PC, Transaction


class Context:
    """What a command needs from the invocation: output mode and the workspace root."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.json: bool = bool(args.get("json"))
        self.root_arg: str | None = args.get("root")
        self.daemon: bool = not args.get("no_daemon")
        self._client: Agent2PC | None = None

    def root(self) -> str:
        """The workspace root (raises NotInitialized when there is none)."""
        from ..coordinator.client import Agent2PC

        return Agent2PC.find_root(self.root_arg)

    def client(self) -> Agent2PC:
        if self._client is None:
            from ..coordinator.client import Agent2PC

            self._client = Agent2PC(self.root(), daemon=self.daemon)
        return self._client

    def tx(self, args: dict[str, Any]) -> Transaction:
        """The transaction ``--tid`` names, unchecked: each step checks it after its own
        arguments."""
        from .distributed import is_global, refuse_local, step

        if is_global(args["tid"]):
            return step(args)  # type: ignore[return-value]
        refuse_local(args)
        return self.client().get(args["tid"], check=False)


# Options whose bytes are content, passed on as they are (surrogate escapes turn back into the
# original bytes); every other value is recorded as JSON text and must be UTF-8.
_RAW_BYTES = frozenset({"content", "old", "new", "argv"})


def _check_utf8(args: dict[str, Any]) -> None:
    for key, value in args.items():
        if key in _RAW_BYTES:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    flag = "--" + key.replace("_", "-")
                    raise UsageError(f"{flag} is not valid UTF-8; agent-2pc records names, "
                                     "paths and labels as UTF-8 text") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from .commands import COMMANDS
    from .monitor import MONITORING

    as_json = "--json" in (argv[:argv.index("--")] if "--" in argv else argv)
    try:
        path, args = parse(argv, COMMANDS + MONITORING)
    except HelpRequested as req:
        sys.stdout.write(req.text)
        return 0
    except UsageError as err:
        emit_error(err, as_json)
        return err.exit_status
    cmd = path[-1]
    ctx = Context(args)
    try:
        _check_utf8(args)
        assert cmd.run is not None, cmd.name
        result = cmd.run(ctx, args)
    except Agent2PCError as err:
        emit_error(err, ctx.json)
        return err.exit_status
    except OSError as exc:  # a disk that refuses (EIO, ENOSPC): an answer, not a traceback
        io = IoFailed.from_os_error(exc)
        emit_error(io, ctx.json)
        return io.exit_status
    except KeyboardInterrupt:
        return 130
    if result is not None:
        emit(result, ctx.json, cmd.extra.get("text"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
