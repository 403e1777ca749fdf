"""The transaction's tools, as plain annotated functions that each framework turns into its own
tools: read and stage files, run commands in the staged view, look at the diff, commit or
abort. Every answer is the library's JSON shape (``{ok: true, ...}`` or ``{ok: false, error:
{code, message}}``): a refusal is an answer the model can read, never an exception that ends
the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..errors import Agent2PCError, CheckFailed
from ..results import failure, success

if TYPE_CHECKING:
    from ..coordinator.client import Transaction

OUTPUT_CHARS_MAX = 20_000  # a command's output given back to the model, at most (its end)


def _answer(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return success(fn())
    except Agent2PCError as err:
        return failure(err)


def _run_output(res: dict[str, Any]) -> str:
    log = res.get("log")
    text = str(res.get("tail") or "")
    if log:
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            pass
    return text[-OUTPUT_CHARS_MAX:]


def _exec(tx: Transaction, command: str) -> dict[str, Any]:
    try:
        res = tx.exec(["/bin/sh", "-c", command], keep_on_failure=True)
    except CheckFailed as err:  # it failed: what it changed is staged all the same
        res = err.details.get("result") or {}
        if "exit_code" not in res:
            raise
    return {"exit_code": res["exit_code"], "output": _run_output(res),
            "captured": [{"path": c["path"], "op": c["op"]} for c in res.get("captured") or []]}


def _check(tx: Transaction, command: str) -> dict[str, Any]:
    try:
        res = tx.stage_cmd(command)
    except CheckFailed as err:  # a failing check is an answer
        res = err.details.get("result") or {}
        if "exit_code" not in res:
            raise
    return {"passed": bool(res.get("passed")), "exit_code": res["exit_code"],
            "output": _run_output(res)}


def transaction_tools(tx: Transaction, *, allow_commit: bool = True
                      ) -> list[Callable[..., dict[str, Any]]]:
    """The tools on ``tx``: functions with annotations and docstrings (their schemas)."""

    def read_file(path: str) -> dict[str, Any]:
        """Read a file as the transaction sees it (what it staged, else the tree's content).
        The answer's `content` is null for an absent file."""
        def run() -> dict[str, Any]:
            data = tx.read(path)
            return {"path": path, "content": None if data is None else
                    data.decode("utf-8", "replace")}
        return _answer(run)

    def write_file(path: str, content: str) -> dict[str, Any]:
        """Stage a file's whole new content (created with its directories if absent)."""
        return _answer(lambda: tx.stage_write(path, content))

    def replace_in_file(path: str, old: str, new: str) -> dict[str, Any]:
        """Stage replacing the one occurrence of `old` in a file by `new`."""
        return _answer(lambda: tx.stage_replace(path, old, new))

    def delete_file(path: str) -> dict[str, Any]:
        """Stage deleting a file."""
        return _answer(lambda: tx.stage_delete(path))

    def apply_patch(patch: str) -> dict[str, Any]:
        """Stage a unified diff (git-style or plain, several files at once)."""
        return _answer(lambda: tx.stage_patch(patch))

    def run_command(command: str) -> dict[str, Any]:
        """Run a shell command in the transaction's staged view of the repository and stage
        what it changes. Answers its exit code, its output and the staged changes."""
        return _answer(lambda: _exec(tx, command))

    def run_check(command: str) -> dict[str, Any]:
        """Run a check (tests, a linter) in the staged view. Commit runs it again if the
        files changed since; a commit while it fails aborts the transaction: fix it first."""
        return _answer(lambda: _check(tx, command))

    def show_diff() -> dict[str, Any]:
        """What the transaction would change: the files and a unified diff."""
        return _answer(lambda: tx.diff())

    def commit() -> dict[str, Any]:
        """Apply everything staged to the repository atomically (or nothing: a conflict or a
        failing check aborts the transaction)."""
        return _answer(lambda: tx.commit())

    def abort(reason: str) -> dict[str, Any]:
        """Drop everything staged; the repository stays as it was."""
        return _answer(lambda: tx.abort(reason))

    tools: list[Callable[..., dict[str, Any]]] = [
        read_file, write_file, replace_in_file, delete_file, apply_patch, run_command,
        run_check, show_diff]
    if allow_commit:
        tools += [commit, abort]
    return tools
