"""What every framework's fencing wrapper shares: a side-effecting tool call runs under the
effect fence (docs/fence.md) once per intent, and a retry of the same call gets the recorded
result instead of a second effect.

The intent of a call is, in this order: the caller's idempotency key, else the framework's
tool-call id (the same call retried or replayed from a saved run keeps its id), prefixed with
the wrapper's ``namespace`` and the tool's name so that ids of different runs and tools never
meet. A result must be JSON (str, numbers, lists, dicts) to be recorded.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..errors import UsageError

if TYPE_CHECKING:
    from ..fence import Fence

KEY_ARG = "idempotency_key"  # an argument of this name is the call's key (not passed on)
DEFAULT_WAIT_S = 30.0


def open_store(fence: Fence | str | None, root: str | os.PathLike[str] | None) -> Fence:
    """``fence`` itself, or the fence at that store URL, or (None) $AGENT2PC_FENCE_STORE, else
    the workspace's own SQLite store (``.agent-tx/fence.db``, as the CLI's ``fence``)."""
    from ..fence import Fence, open_fence

    if isinstance(fence, Fence):
        return fence
    url = fence or os.environ.get("AGENT2PC_FENCE_STORE")
    if not url:
        from ..coordinator.client import Agent2PC

        found = Agent2PC.find_root(root)
        url = "sqlite:///" + os.path.join(found, ".agent-tx", "fence.db").lstrip("/")
    return open_fence(url)


class ToolFence:
    """Runs tool calls under a fence. ``namespace`` tells runs apart whose call ids may repeat
    (a scripted model's); ``domain`` is the fence domain of the effects (docs/fence.md);
    ``failed_on``: exceptions that mean the effect surely did not happen (the intent is freed
    for a retry; any other exception fences it until reconciled)."""

    def __init__(self, fence: Fence | str | None = None, *,
                 root: str | os.PathLike[str] | None = None, namespace: str = "",
                 domain: str = "default", agent: str | None = None,
                 failed_on: tuple[type[BaseException], ...] = (),
                 wait_s: float = DEFAULT_WAIT_S) -> None:
        self._spec, self._root = fence, root
        self._fence: Fence | None = None
        self.namespace = namespace
        self.domain = domain
        self.agent = agent
        self.failed_on = failed_on
        self.wait_s = wait_s

    @property
    def fence(self) -> Fence:
        """The fence, opened at first use (a tool may be made before its workspace exists)."""
        if self._fence is None:
            self._fence = open_store(self._spec, self._root)
        return self._fence

    def use_root(self, root: str | None) -> None:
        """Where to find the workspace's store when none was named (a run's config says)."""
        if root and self._fence is None and self._spec is None and self._root is None:
            self._root = root

    def intent(self, tool: str, call_id: str | None, key: str | None) -> str:
        name = key if key is not None else call_id
        if not name:
            raise UsageError(f"the call of {tool!r} has neither an idempotency key nor a "
                             "tool-call id: the fence cannot tell a retry from a new call")
        head = f"{self.namespace}:" if self.namespace else ""
        return f"{head}{tool}:{'key' if key is not None else 'call'}:{name}"

    def _once(self, tool: str, args: dict[str, Any], call_id: str | None, key: str | None,
              fn: Callable[[], Any]) -> Callable[[], Any]:
        intent = self.intent(tool, call_id, key)
        wrapped: Callable[[], Any] = self.fence.once(
            lambda: intent, self.domain, tool=tool, agent=self.agent, args=lambda: args,
            failed_on=self.failed_on, wait_s=self.wait_s)(fn)
        return wrapped

    def call(self, tool: str, args: dict[str, Any], fn: Callable[[], Any], *,
             call_id: str | None = None, key: str | None = None) -> Any:
        """``fn()`` once for this call: its result, or the recorded one on a retry."""
        return self._once(tool, args, call_id, key, fn)()

    async def acall(self, tool: str, args: dict[str, Any], fn: Callable[[], Awaitable[Any]],
                    *, call_id: str | None = None, key: str | None = None) -> Any:
        """As ``call`` for a coroutine function."""
        async def run() -> Any:
            return await fn()

        return await self._once(tool, args, call_id, key, run)()


def split_key(args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The arguments without the idempotency key, and the key (a string, or None)."""
    if KEY_ARG not in args:
        return args, None
    rest = {k: v for k, v in args.items() if k != KEY_ARG}
    key = args[KEY_ARG]
    if key is not None and not isinstance(key, str):
        raise UsageError(f"{KEY_ARG} must be a string")
    return rest, key
