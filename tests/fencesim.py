"""A seeded simulation of the effect fence and the API participant (FoundationDB's simulator and
TigerBeetle's VOPR in spirit): many agents, a fake clock, a fake payment service behind a
fake network, crashes, pauses longer than a lease, delayed, duplicated and lost messages --
all drawn from one seed, so that every run is reproduced by its seed.

    python tests/fencesim.py --seeds 10000            # by hand (prints the failing seeds)
    python tests/fencesim.py --seed 1234 -v           # one seed, with its event log

What runs is the real code: ``ApiParticipant.call`` (lease, logged ticket, sends with the same
Idempotency-Key, retries, heartbeats, takeover) over a real ``Fence`` whose store is the memory
store on the simulated clock (the ledger's decisions are the same functions for every store).
Only the outside world is simulated: time (``time.sleep`` of the participant and the store's
clock), the network (``_send``), the service, and the agents' crashes. Agents are threads, but
exactly one runs at a time, handed the baton by a scheduler that picks the next event from a
seeded queue: the interleaving is a function of the seed.

A crashed agent loses everything but what it had logged durably (the ticket the participant
hands to ``sending`` before a request leaves, as the engine syncs it into its log), and comes
back later to finish its call from there, as recovery does. At the end the world goes quiet
(no more faults) and every agent finishes; then the invariants:

  - the service carried out each intent's effect at most once (never two), and exactly once
    when any agent was told it was done; the answer every agent got is the service's;
  - the fence agrees with the service: an intent is done exactly when its effect happened,
    with the service's answer as its certificate's result; an intent the fence recorded as
    done stays done with the same certificate (no second admission);
  - no agent died of anything but the simulated crashes and the fence's refusals;
  - fencing tokens only grow.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field

from agent_2pc.errors import FenceRefusal
from agent_2pc.fence import Fence
from agent_2pc.fence._memory import MemoryStore
from agent_2pc.participants import api as api_mod

TIME_LIMIT_S = 3600.0  # simulated seconds before a run counts as stuck
LEASE_TTL_S = 4.0
TIMEOUT_S = 1.0  # the participant's wait for an answer


class Crashed(BaseException):
    """Raised inside an agent at a yield point: the process died there."""


class Stuck(Exception):
    pass


@dataclass
class Faults:
    crash: float  # per yield point
    pause: float  # per yield point: a pause longer than a lease
    loss: float  # per message
    dup: float  # per request
    delay_max: float  # seconds of network delay
    error_500: float  # the service answers 500 after doing it
    reject_503: float  # the service refuses without doing it


@dataclass
class Task:
    name: str
    fn: object
    sem: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    thread: threading.Thread | None = None
    crash_next: bool = False
    done: bool = False
    error: BaseException | None = None
    value: object = None


class Sim:
    """The scheduler: a seeded event queue and one baton."""

    def __init__(self, seed: int, faults: Faults, verbose: bool = False) -> None:
        self.rng = random.Random(seed)
        self.faults = faults
        self.now = 1_000_000.0
        self.queue: list[tuple[float, int, object]] = []
        self.seq = 0
        self.main = threading.Semaphore(0)
        self.current: Task | None = None
        self.quiet = False  # no more faults
        self.verbose = verbose
        self.log: list[str] = []
        self.stats: dict[str, int] = {}

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def note(self, text: str) -> None:
        if self.verbose:
            self.log.append(f"{self.now - 1_000_000.0:9.3f} {text}")

    def at(self, delay: float, item: object) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (self.now + delay, self.seq, item))

    def spawn(self, name: str, fn: object, delay: float = 0.0) -> Task:
        task = Task(name, fn)

        def body() -> None:
            task.sem.acquire()
            try:
                task.value = task.fn()  # type: ignore[operator]
            except Crashed:
                task.error = Crashed()
            except BaseException as exc:  # noqa: BLE001 - reported as a violation
                task.error = exc
            finally:
                task.done = True
                self.main.release()

        task.thread = threading.Thread(target=body, daemon=True, name=name)
        task.thread.start()
        self.at(delay, task)
        return task

    def run(self) -> None:
        while self.queue:
            t, _, item = heapq.heappop(self.queue)
            self.now = max(self.now, t)
            if self.now - 1_000_000.0 > TIME_LIMIT_S:
                raise Stuck(f"still busy after {TIME_LIMIT_S:g} simulated seconds")
            if isinstance(item, Task):
                if item.done:
                    continue
                self.current = item
                item.sem.release()
                self.main.acquire()
                self.current = None
            else:
                item()  # type: ignore[operator]

    # -- called from agent threads --------------------------------------------------------

    def block(self, delay: float) -> None:
        """Let the others run for ``delay`` simulated seconds; maybe die or stall here."""
        task = self.current
        assert task is not None
        if not self.quiet and self.rng.random() < self.faults.pause:
            delay += LEASE_TTL_S * (1 + 2 * self.rng.random())
            self.note(f"{task.name} pauses")
            self.count("pauses")
        self.at(delay, task)
        self.main.release()
        task.sem.acquire()
        if not self.quiet and self.rng.random() < self.faults.crash:
            self.note(f"{task.name} crashes")
            self.count("crashes")
            raise Crashed()

    def wait(self, register: object, timeout: float) -> object:
        """Block until ``register(wake)`` calls wake(value) or ``timeout`` passes (None)."""
        task = self.current
        assert task is not None
        box: dict[str, object] = {}

        def wake(value: object) -> None:
            if "v" not in box:
                box["v"] = value
                self.at(0.0, task)

        register(wake)  # type: ignore[operator]
        self.at(timeout, lambda: wake(None))
        self.main.release()
        task.sem.acquire()
        if not self.quiet and self.rng.random() < self.faults.crash:
            self.note(f"{task.name} crashes waiting")
            self.count("crashes")
            raise Crashed()
        return box["v"]


class Service:
    """A payment service honouring Idempotency-Key (as tests/api_server.py does), reached
    through a network that delays, duplicates and loses messages."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.executed: dict[str, int] = {}
        self.stored: dict[str, tuple[int, dict[str, object]]] = {}
        self.running: set[str] = set()
        self.charges = 0

    def request(self, key: str, body: dict[str, object], wake: object) -> None:
        sim, f = self.sim, self.sim.faults
        copies = 2 if not sim.quiet and sim.rng.random() < f.dup else 1
        if copies == 2:
            sim.count("requests duplicated")
        for _ in range(copies):
            if not sim.quiet and sim.rng.random() < f.loss:
                sim.note(f"request {key} lost")
                sim.count("messages lost")
                continue
            sim.count("requests delivered")
            sim.at(sim.rng.random() * f.delay_max,
                   lambda: self._arrive(key, body, wake))

    def _arrive(self, key: str, body: dict[str, object], wake: object) -> None:
        sim, f = self.sim, self.sim.faults
        if key in self.stored:
            status, reply = self.stored[key]
            return self._answer(wake, status, reply, replayed=True)
        if key in self.running:
            return self._answer(wake, 409, {"error": "running"})
        if not sim.quiet and sim.rng.random() < f.reject_503:
            return self._answer(wake, 503, {"error": "try again"})
        self.running.add(key)

        def finish() -> None:
            self.running.discard(key)
            self.charges += 1
            self.executed[key] = self.executed.get(key, 0) + 1
            sim.note(f"service executes {key} (#{self.executed[key]})")
            status, reply = 200, {"id": f"ch_{self.charges}", "amount": body.get("amount")}
            if not sim.quiet and sim.rng.random() < f.error_500:
                status, reply = 500, {"error": "after the effect"}
            self.stored[key] = (status, reply)
            self._answer(wake, status, reply)

        sim.at(sim.rng.random() * f.delay_max, finish)

    def _answer(self, wake: object, status: int, reply: dict[str, object],
                replayed: bool = False) -> None:
        sim = self.sim
        if not sim.quiet and sim.rng.random() < sim.faults.loss:
            sim.note("answer lost")
            sim.count("messages lost")
            return
        headers = {"idempotent-replayed": "true"} if replayed else {}
        answer = {"status": status, "response": {"status": status, "headers": headers,
                                                 "body": json.dumps(reply),
                                                 "truncated": False}}
        sim.at(sim.rng.random() * sim.faults.delay_max, lambda: wake(answer))  # type: ignore


class SimParticipant(api_mod.ApiParticipant):
    def __init__(self, fence: Fence, sim: Sim, service: Service) -> None:
        super().__init__(lambda: fence)
        self.sim, self.service = sim, service

    def _send(self, request: dict[str, object], key: str) -> dict[str, object]:
        self.sim.note(f"{self.sim.current.name if self.sim.current else '?'} sends {key}")
        self.sim.count("sends")
        if BROKEN == "fresh-key":  # the classic bug: a new key for every attempt
            key = f"{key}#{self.sim.stats['sends']}"
        got = self.sim.wait(lambda wake: self.service.request(key, request["body"], wake),
                            TIMEOUT_S)  # type: ignore[index,arg-type]
        if got is None:
            return {"status": None, "error": "timed out"}
        return got  # type: ignore[return-value]

    def close(self) -> None:  # the fence outlives a call here (one store for everyone)
        pass


class SimStore(MemoryStore):
    """The memory store on the simulated clock; each decision and read takes a moment (the
    agents interleave there), and every token it draws is checked to grow."""

    def __init__(self, sim: Sim) -> None:
        super().__init__("memory://sim", clock=lambda: sim.now)
        self.sim = sim
        self.tokens: list[int] = []

    def decide(self, intent, fn, counters, durable=True):  # type: ignore[no-untyped-def]
        if self.sim.current is not None:
            self.sim.block(self.sim.rng.random() * 0.01)
        dec = super().decide(intent, fn, counters, durable)
        ticket = getattr(dec.outcome, "ticket", None)  # a Fresh lease: a token drawn
        if ticket is not None:
            self.tokens.append(ticket.token)
        return dec

    def snapshot(self, intent):  # type: ignore[no-untyped-def]
        if self.sim.current is not None:
            self.sim.block(self.sim.rng.random() * 0.01)
        return super().snapshot(intent)


class _Clock:
    """What the participant's ``time`` is in the simulation."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def sleep(self, s: float) -> None:
        self.sim.block(s)

    def time(self) -> float:
        return self.sim.now

    def monotonic(self) -> float:
        return self.sim.now


def faults_for(rng: random.Random) -> Faults:
    """Each seed draws its own weather: some calm, some stormy."""
    return Faults(crash=rng.choice([0.0, 0.01, 0.05]), pause=rng.choice([0.0, 0.01, 0.03]),
                  loss=rng.choice([0.0, 0.05, 0.2]), dup=rng.choice([0.0, 0.1, 0.3]),
                  delay_max=rng.choice([0.05, 0.5, 1.5]), error_500=rng.choice([0.0, 0.1]),
                  reject_503=rng.choice([0.0, 0.1]))


BROKEN = ""  # a planted bug (--broken): the simulation must find it


def run_seed(seed: int, verbose: bool = False, stats: dict[str, int] | None = None
             ) -> list[str]:
    """Run one simulation; the list of violated invariants (empty: clean)."""
    pick = random.Random(seed)
    sim = Sim(seed, faults_for(pick), verbose)
    store = SimStore(sim)
    fence = Fence(store, lease_ttl=LEASE_TTL_S, result_ttl=86400.0)
    service = Service(sim)
    n_agents, n_intents = pick.randint(1, 6), pick.randint(1, 3)
    intents = [f"pay-{seed}-{i}" for i in range(n_intents)]
    durable: dict[tuple[str, str], dict[str, object]] = {}  # what each agent logged, synced
    told: list[tuple[str, str, dict[str, object]]] = []  # (agent, intent, result) of DONE
    problems: list[str] = []
    done_certs: dict[str, str] = {}
    unknown: list[str] = []  # intents left fenced (unknown outcome), reconciled at the end

    def agent(name: str, todo: list[str]) -> object:
        participant = SimParticipant(fence, sim, service)
        for intent in todo:
            log = durable.setdefault((name, intent), {})
            if log.get("outcome") == api_mod.DONE:
                continue
            for _ in range(20):  # bounded: a refusal (in flight elsewhere) is tried again
                request = {"method": "POST", "url": "http://pay.example/charges",
                           "body": {"amount": 500}}
                try:
                    res = participant.call(request, intent, name,
                                           lambda t, log=log: log.update(ticket=t),
                                           log.get("ticket"))  # type: ignore[arg-type]
                except FenceRefusal as exc:  # a heartbeat refused: no longer the holder
                    sim.note(f"{name} {intent}: {exc.code}")
                    log.pop("ticket", None)
                    sim.block(sim.rng.random())
                    continue
                log.pop("ticket", None)
                sim.note(f"{name} {intent}: {res['outcome']} {res.get('code') or ''}")
                if res["outcome"] == api_mod.DONE:
                    log["outcome"] = api_mod.DONE
                    told.append((name, intent, res))
                    cert = fence.certificate(intent)
                    if cert is not None:
                        if intent in done_certs and done_certs[intent] != cert.hash:
                            problems.append(f"{intent}: its certificate changed")
                        done_certs[intent] = cert.hash
                    break
                sim.block(sim.rng.random() * 2)  # unknown, or in flight elsewhere: later
        return None

    clock = _Clock(sim)
    saved = (api_mod.time, api_mod.ATTEMPTS, api_mod.BACKOFF_S)
    api_mod.time = clock  # type: ignore[assignment]
    api_mod.ATTEMPTS, api_mod.BACKOFF_S = 3, (0.2, 0.5, 1.0)
    try:
        plans = []
        for a in range(n_agents):
            todo = [i for i in intents if pick.random() < 0.7] or [pick.choice(intents)]
            pick.shuffle(todo)
            plans.append((f"agent{a}", todo))
        tasks = {name: sim.spawn(name, (lambda n=name, t=todo: agent(n, t)),
                                 pick.random()) for name, todo in plans}
        # Crashed agents come back, as recovery does, until the world goes quiet.
        for _ in range(50):
            sim.run()
            crashed = [n for n, t in tasks.items() if isinstance(t.error, Crashed)]
            others = [(n, t.error) for n, t in tasks.items()
                      if t.error is not None and not isinstance(t.error, Crashed)]
            for n, err in others:
                problems.append(f"{n} died of {err!r}")
            if not crashed:
                break
            if _ > 10:
                sim.quiet = True
            for n in crashed:
                todo = dict(plans)[n]
                tasks[n] = sim.spawn(n, (lambda n=n, t=todo: agent(n, t)),
                                     1 + sim.rng.random() * 5)
        sim.quiet = True
        # The world is quiet: one last agent finishes every intent (a settled unknown ends
        # done; nothing stays fenced when the service can be asked again).
        sim.at(LEASE_TTL_S * 3, lambda: None)
        sim.spawn("closer", lambda: agent("closer", intents), LEASE_TTL_S * 3)
        sim.run()
    except Stuck as exc:
        problems.append(str(exc))
    finally:
        api_mod.time, api_mod.ATTEMPTS, api_mod.BACKOFF_S = saved  # type: ignore[assignment]
    for intent in intents:
        runs = sum(n for k, n in service.executed.items() if k.split("#")[0] == intent)
        if runs > 1:
            problems.append(f"{intent}: the service carried it out {runs} times")
        entry = store.get(intent)
        answer = service.stored.get(intent, (None, {}))[0]
        if runs == 1 and entry is not None and entry.state == "fenced" and answer \
                and answer >= 500:
            # The service's stored answer to this key is a 5xx: every resend gets it again,
            # so the outcome stays unknown and the intent fenced -- reconcilable, as promised:
            # the operator looks at the service and settles it.
            unknown.append(intent)
            fence.reconcile(intent, "done", {"status": answer, "response": None},
                            "the service says it happened")
            entry = store.get(intent)
        if runs == 1 and (entry is None or entry.state != "done"):
            problems.append(f"{intent}: carried out, yet the fence says "
                            f"{entry.state if entry else 'absent'}")
        if runs == 0 and entry is not None and entry.state == "done":
            problems.append(f"{intent}: done in the fence, never carried out")
        if entry is not None and entry.state == "done":
            stored = service.stored.get(intent)
            assert entry.cert is not None
            if intent not in unknown and (stored is None or
                                          entry.cert.result.get("status") != stored[0]):
                problems.append(f"{intent}: the certificate's result is not the service's")
    for name, intent, res in told:
        stored = service.stored.get(intent)
        if stored is None or res.get("status") != stored[0]:
            problems.append(f"{name} was told {intent} is done with {res.get('status')}, "
                            f"the service stored {stored}")
        runs = sum(n for k, n in service.executed.items() if k.split("#")[0] == intent)
        if runs != 1:
            problems.append(f"{name} was told {intent} is done; it ran {runs} times")
    if any(b <= a for a, b in zip(store.tokens, store.tokens[1:], strict=False)):
        problems.append(f"fencing tokens did not grow: {store.tokens}")
    if verbose:
        print("\n".join(sim.log))
    if stats is not None:
        for k, v in sim.stats.items():
            stats[k] = stats.get(k, 0) + v
        raw = fence.counters()
        stats["takeovers"] = stats.get("takeovers", 0) + raw["takeovers"]
        stats["unknown outcomes reconciled"] = stats.get("unknown outcomes reconciled", 0) \
            + len(unknown)
        stats["effects"] = stats.get("effects", 0) + sum(service.executed.values())
        stats["agents told done"] = stats.get("agents told done", 0) + len(told)
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fencesim")
    p.add_argument("--seeds", type=int, default=200, help="how many seeds (from --first)")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--seed", type=int, help="one seed")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--broken", choices=["fresh-key"], default="",
                   help="plant a bug that the simulation must find")
    args = p.parse_args(argv)
    global BROKEN
    BROKEN = args.broken
    seeds = [args.seed] if args.seed is not None else range(args.first,
                                                            args.first + args.seeds)
    t0 = time.monotonic()
    bad = 0
    stats: dict[str, int] = {}
    for seed in seeds:
        problems = run_seed(seed, args.verbose, stats)
        if problems:
            bad += 1
            print(f"seed {seed}: " + "; ".join(problems), flush=True)
    n = len(list(seeds))
    print(json.dumps({"seeds": n, "failed": bad, "seconds": round(time.monotonic() - t0, 1),
                      "totals": dict(sorted(stats.items()))}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
