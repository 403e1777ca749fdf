"""mini-swe-agent in one transaction: every command the agent runs runs in the staged view of
one transaction (``exec``), so the tree is untouched until the agent submits; the submission
commits (after the checks, if any pass), and a run that ends otherwise (a step or cost limit,
a format error, an exception) aborts. Extra: ``agent-2pc[minisweagent]``.

    from agent_2pc.integrations.minisweagent import TransactionEnvironment, run_in_transaction
    env = TransactionEnvironment(cwd="/path/to/repo", checks=["pytest -q"])  # was LocalEnvironment
    agent = DefaultAgent(model, env, **config["agent"])
    result = run_in_transaction(agent, task)   # result["agent_2pc"]: the commit's or abort's answer

In a mini config: ``environment: {environment_class:
agent_2pc.integrations.minisweagent.TransactionEnvironment, checks: ["pytest -q"]}``; a run
that the ``mini`` command ends without a submission is aborted when the process exits.

A submission whose checks fail is not accepted: the agent gets the check's output as the
command's (return code 1) and goes on working, until it submits again or a limit ends the run.
"""

from __future__ import annotations

import atexit
import os
import shlex
from typing import Any

from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig
from minisweagent.exceptions import InterruptAgentFlow, Submitted

from ..coordinator.client import Agent2PC, Transaction
from ..errors import Agent2PCError, CheckFailed, TransactionAborted

OUTPUT_BYTES_MAX = 1 << 20  # what one command's output may bring back to the model


class TransactionEnvironmentConfig(LocalEnvironmentConfig):
    root: str = ""
    """The workspace root (default: the one at or above ``cwd``, else the working directory).
    It is made a workspace (``agent-2pc init``) if it is not one."""
    checks: list[str] = []
    """Commands that must pass in the staged view before the submission commits."""
    label: str = "mini-swe-agent"
    timeout_ms: int = 0
    """The transaction's timeout (0: the default, 24 h)."""


class TransactionEnvironment(LocalEnvironment):
    """LocalEnvironment's interface; commands run in a transaction's staged view."""

    def __init__(self, *, config_class: type = TransactionEnvironmentConfig,
                 client: Agent2PC | None = None, **kwargs: Any) -> None:
        super().__init__(config_class=config_class, **kwargs)
        cfg = self.config
        start = cfg.root or cfg.cwd or os.getcwd()
        if client is None:
            try:
                client = Agent2PC(start)
            except Agent2PCError:
                client = Agent2PC.init(cfg.root or start)
        self.client = client
        self.tx: Transaction = client.begin(timeout_ms=cfg.timeout_ms or None, label=cfg.label)
        self.outcome: dict[str, Any] | None = None
        atexit.register(self._abort_unfinished, "the run ended without a submission")

    @property
    def tid(self) -> str:
        return self.tx.tid

    # -- running commands -----------------------------------------------------------------------

    def _argv(self, command: str, cwd: str) -> list[str]:
        cwd = cwd or self.config.cwd
        if cwd:
            rel = os.path.relpath(os.path.realpath(cwd), self.client.root)
            if rel != "." and not rel.startswith(".."):
                command = f"cd {shlex.quote(rel)} && {command}"
        env = [f"{k}={v}" for k, v in self.config.env.items()]
        return (["env", *env] if env else []) + ["/bin/sh", "-c", command]

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
                ) -> dict[str, Any]:
        """Run the action's command in the staged view and stage what it changed (whatever its
        exit status, as a shell would have left it); a submission commits."""
        command = action.get("command", "")
        seconds = timeout or self.config.timeout
        res: dict[str, Any]
        try:
            res = self.tx.exec(self._argv(command, cwd), timeout_ms=int(seconds * 1000),
                               keep_on_failure=True)
        except CheckFailed as err:
            got = err.details.get("result")
            res = got if isinstance(got, dict) else {}
            if "exit_code" not in res:
                return _failed(f"agent-2pc refused the command: {err.message}", err.code)
            if res.get("timed_out"):
                out = _failed(f"An error occurred while executing the command: it timed out "
                              f"after {seconds} s", "TimeoutExpired")
                out["output"] = _output(res)
                return out
        except Agent2PCError as err:
            return _failed(f"agent-2pc refused the command: {err.message}", err.code)
        output = {"output": _output(res), "returncode": res["exit_code"], "exception_info": ""}
        try:
            self._check_finished(output)
        except Submitted as sub:
            return self._submit(sub, output)
        return output

    # -- the end of the run ---------------------------------------------------------------------

    def _submit(self, sub: Submitted, output: dict[str, Any]) -> dict[str, Any]:
        for check in self.config.checks:
            try:
                self.tx.stage_cmd(check)
            except CheckFailed as err:
                res = err.details.get("result") or {}
                return {"output": f"The submission was not accepted: the check {check!r} "
                        f"failed (exit {res.get('exit_code')}). Its output:\n" + _output(res),
                        "returncode": 1, "exception_info": ""}
        try:
            self.outcome = self.tx.commit()
        except TransactionAborted as err:
            self.outcome = {"tid": self.tid, "state": "aborted", "code": err.code,
                            "reason": err.reason}
            raise InterruptAgentFlow({"role": "exit", "content": err.reason, "extra": {
                "exit_status": "TransactionAborted", "submission": "",
                "agent_2pc": self.outcome}}) from None
        for msg in sub.messages:
            msg.setdefault("extra", {})["agent_2pc"] = self.outcome
        raise sub

    def finish(self, exit_status: str | None = None) -> dict[str, Any]:
        """The transaction's answer: the commit's after a submission; otherwise abort it
        (``exit_status`` says why: LimitsExceeded, an exception's name, ...)."""
        if self.outcome is None:
            self.outcome = self.tx.abort(f"mini-swe-agent: {exit_status or 'no submission'}")
        return self.outcome

    def _abort_unfinished(self, why: str) -> None:
        if self.outcome is None:
            try:
                self.finish(why)
            except (Agent2PCError, OSError):  # the workspace is gone or refuses: nothing to do
                pass

    def __enter__(self) -> TransactionEnvironment:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish(type(exc[1]).__name__ if exc[1] is not None else None)

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return super().get_template_vars(agent_2pc_tid=self.tid, **kwargs)


def run_in_transaction(agent: Any, task: str, **kwargs: Any) -> dict[str, Any]:
    """``agent.run(task)`` with a TransactionEnvironment: the submission commits, any other end
    aborts (an exception is raised again after the abort). The answer is the run's, plus
    ``agent_2pc``: the commit's or the abort's answer."""
    env = agent.env
    if not isinstance(env, TransactionEnvironment):
        raise TypeError("the agent's environment is not a TransactionEnvironment")
    try:
        result = agent.run(task, **kwargs)
    except BaseException as exc:
        env.finish(type(exc).__name__)
        raise
    return {**result, "agent_2pc": env.finish(result.get("exit_status"))}


def _output(res: dict[str, Any]) -> str:
    log = res.get("log")
    if log:
        try:
            with open(log, "rb") as f:
                data = f.read(OUTPUT_BYTES_MAX + 1)
        except OSError:
            data = None
        if data is not None:
            text = data[:OUTPUT_BYTES_MAX].decode("utf-8", "replace")
            return text + ("\n[output cut at 1 MiB]\n" if len(data) > OUTPUT_BYTES_MAX else "")
    return str(res.get("tail") or "")


def _failed(message: str, kind: str) -> dict[str, Any]:
    return {"output": "", "returncode": -1, "exception_info": message,
            "extra": {"exception_type": kind, "exception": message}}
