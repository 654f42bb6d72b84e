"""The controller: leader election, then snapshot -> decisions.reconcile -> fenced writes.

Every controller keeps a watched cache of the cluster state (standbys too: they serve reads
and take over with a warm cache). Only the leader decides; each of its writes compares the
leader key's create_revision, so a deposed leader cannot change anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from hafo.controller.apply import apply_plan
from hafo.controller.autoscale import Autoscaler
from hafo.controller.conditions import ClusterConditions
from hafo.controller.demand_metrics import register_demand_metrics
from hafo.controller.failsafe import ControllerFailsafe
from hafo.controller.fair_share import FairShareHistory, register_history_metrics
from hafo.controller.history import HistoryWriter
from hafo.controller.metrics import ControllerMetrics
from hafo.decisions.api_auth import api_auth_of
from hafo.decisions.demand import Demand, demand, observe_idle
from hafo.decisions.live_view import dormant, live_view
from hafo.decisions.observed import Observations, observe
from hafo.decisions.reconcile import reconcile
from hafo.model.clocks import SteadyClock
from hafo.model.cluster import ClusterSnapshot, Event
from hafo.model.config import Config
from hafo.model.teams import TeamTokensFile
from hafo.retry import Retry, RetryPolicy
from hafo.store import (
    TRANSIENT,
    ClusterCache,
    Election,
    EtcdStore,
    EventLog,
    Keys,
    LeaseKeeper,
    LeaseLost,
    NotLeader,
    StoreError,
    codec,
    read_events,
)
from hafo.store.api_auth import ApiAuthAgreement
from hafo.store.identity import StoreTrust
from hafo.store.name_index import ensure_name_index
from hafo.store.protocol import Store
from hafo.tasks import retrieve_outcome, run_all, wait_event

log = structlog.get_logger("hafo.controller")
RECOVERABLE: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError)

TICK = 1.0  # time-based decisions (restart windows, cool-downs) are re-evaluated this often
#: The leader's demand (pending shapes, removable nodes: ``hafo.decisions.demand``) is
#: computed again at most this often (seconds); the autoscale hook is rate-limited far more.
DEMAND_EVERY = 1.0
#: ... and at most this share of the leader's time: it repeats admission over every pending
#: workload, on the event loop (at thousands pending, every few seconds).
DEMAND_SHARE = 0.05
TRUST_EVERY = 1.0  # how often the store's identity is read (hafo.store.identity)


class Controller:
    """One controller process."""

    def __init__(self, config: Config, clock: Callable[[], float] | None = None,
                 store: Store | None = None, api_token: str | None = None,
                 api_teams: TeamTokensFile | None = None) -> None:
        """``clock``: seconds for decisions (default: wall clock at start, advanced by the
        monotonic clock, so that a step of the wall clock changes no decision:
        ``hafo.model.clocks.SteadyClock``); ``store``: etcd from the config
        unless given (tests pass ``hafo.store.memory.MemoryStore``); ``api_token``: the one
        its API needs (``api.token_file``), and ``api_teams`` the team tokens it accepts too
        (``api.team_tokens_file``), compared with the other controllers'."""
        assert config.controller_name is not None
        self.config = config
        self.name = config.controller_name
        self.keys = Keys(config.cluster)
        self.store: Store = store if store is not None else EtcdStore.from_config(
            config.etcd, reconnect_backoff=config.timing.heartbeat / 2)
        self.registry = CollectorRegistry()  # Prometheus metrics served at /metrics
        timing = config.timing
        self.keeper = LeaseKeeper(self.store, timing.lease_ttl, timing.heartbeat,
                                  timing.fence_margin)
        self.election = Election(self.store, self.keys.leader, self.name)
        self.cache = ClusterCache(self.store, self.keys)
        self.events = EventLog(self.store, self.keys)
        self.history = HistoryWriter(self.store, self.keys)
        #: the queues' decayed usage while leading (``fair_sharing.usage_half_life``)
        self.fair_share = FairShareHistory(self.store, self.keys,
                                           config.fair_sharing.usage_half_life)
        self.trust = StoreTrust(self.store, self.keys, f"controller {self.name}")
        self.api_auth = ApiAuthAgreement(self.store, self.keys, self.name, api_auth_of(
            api_token, config.api.scheme == "https", config.cluster, api_teams), self.events)
        self.failsafe = ControllerFailsafe(self.name, self.store, self.keys, timing.lease_ttl,
                                           timing.fence_margin, timing.failsafe_max,
                                           store_problem=self.store_problem)
        self.trusted_at = 0.0  # keeper clock of the last read that found the store trusted
        self.hold_until = 0.0  # failsafe clock: no decision before (after a store is trusted
        # again, until every failsafe promise given while it was not has run out)
        clock = clock if clock is not None else SteadyClock()
        self.clock = clock
        #: when this controller first saw each exit, run and assignment, on ``clock``
        #: (``hafo.decisions.observed``): backoffs are timed from them
        self.seen = Observations()
        self.is_leader = False
        self.connected = False
        self.cycles = 0
        self.metrics = ControllerMetrics(self, self.registry, lease_ttl=timing.lease_ttl,
                                         clock=clock,
                                         api_auth_mismatch=lambda: self.api_auth.mismatch)
        self.store.observer = self.metrics.observe_etcd
        self.conditions = ClusterConditions(self.events, self.leading, self.registry)
        # -- elastic capacity (hafo.decisions.demand, hafo.controller.autoscale) --
        #: node -> when this controller, leading, first saw it idle, on ``clock``
        self.idle_since: dict[str, float] = {}
        #: the demand of the leader's last cycle (None: not leading, or no cycle yet)
        self.last_demand: Demand | None = None
        self.demand_at = 0.0  # when last_demand was computed (the controller's clock)
        self.demand_every = DEMAND_EVERY  # until it is computed next (DEMAND_SHARE)
        self.autoscaler = Autoscaler(config.autoscale, self.registry)
        register_demand_metrics(self.registry, self.current_demand)
        register_history_metrics(self.registry, self.fair_share, self.leading)

    # -- read side (HTTP API) -------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """The cache's current snapshot (a node with a resource fault of its own unhealthy,
        as the leader decides: ``hafo.controller.conditions``)."""
        return self.conditions.view(self.cache.snapshot())

    def ready(self) -> bool:
        """Connected to etcd, holding a live lease, on a store that is the cluster."""
        return self.connected and self.keeper.valid() and not self.store_problem()

    def store_problem(self) -> str:
        """Why the store is not to be trusted as the cluster (``hafo.store.identity``: its
        identity record or revision, or agents that know another cluster), or ''."""
        if not self.trust.trusted:
            return self.trust.reason
        return self.failsafe.contested

    def stale_seconds(self) -> float | None:
        """How old the cache may be when etcd has not answered this controller for more than
        two heartbeats (seconds since its last acknowledged keepalive), or when the store is
        not the cluster (seconds since it last was); None while fresh."""
        if self.store_problem():
            return round(max(0.0, self.keeper.clock() - self.trusted_at), 1)
        age = self.keeper.clock() - self.keeper.last_ack
        if self.connected and age <= 2 * self.config.timing.heartbeat:
            return None
        return round(age, 1)

    def etcd_contact_age(self) -> float:
        """Seconds since etcd last acknowledged our keepalive."""
        return round(self.keeper.clock() - self.keeper.last_ack, 3)

    def not_ready_reason(self) -> str:
        """For ``/readyz``'s 503: how long etcd has not answered us, or why the store is not
        the cluster."""
        problem = self.store_problem()
        if problem:
            return f"etcd is not the cluster this controller knew: {problem}"
        stale = self.stale_seconds()
        if stale is None or not self.connected:
            return "not connected to etcd"
        return (f"not connected to etcd for {stale:.0f} s: answers come from a cache of "
                "that age")

    def leading(self) -> bool:
        """True while this controller is the leader and its lease is valid."""
        return self.is_leader and self.keeper.valid()

    async def recent_events(self, limit: int = 100) -> list[Event]:
        """The newest events."""
        return await read_events(self.store, self.keys, limit)

    def current_demand(self) -> Demand:
        """The demand as this controller knows it: the leader's of its last cycle; else the
        pending shapes of its cache, and no removable node (a standby observes no idle
        node). Never raises (read at scrape time)."""
        if self.leading() and self.last_demand is not None:
            return self.last_demand
        try:
            return demand(self.snapshot(), {}, self.clock(), 0.0)
        except Exception:  # a metrics scrape must not fail on a bug here
            log.exception("demand not computed")
            return Demand()

    def demand_view(self) -> dict[str, Any]:
        """``GET /v1/demand``'s body (docs/reference/elastic.md, "Elastic capacity")."""
        return {**self.current_demand().to_dict(time.time()), "leader": self.leading()}

    def _elastic_step(self, snapshot: ClusterSnapshot, now: float) -> None:
        """The leader's cycle, for elastic capacity: idle sightings, the demand, and a call
        of the autoscale hook when it is due (in the background). Never raises: deciding
        goes on whatever happens here."""
        try:
            self.idle_since = observe_idle(self.idle_since, snapshot, now)
            if self.last_demand is None or not 0.0 <= now - self.demand_at < self.demand_every:
                # At most every DEMAND_EVERY, and DEMAND_SHARE of this loop's time: the
                # demand repeats admission over every pending workload, between two cycles.
                started = time.monotonic()
                self.last_demand = demand(snapshot, self.idle_since, now,
                                          self.config.autoscale.idle_after,
                                          self.config.placement.spares)
                self.demand_at = now
                self.demand_every = max(DEMAND_EVERY,
                                        (time.monotonic() - started) / DEMAND_SHARE)
            self.autoscaler.step(self.last_demand, now)
        except Exception:
            log.exception("demand not computed")

    # -- loops --------------------------------------------------------------------------

    async def _keep_lease(self) -> None:
        while True:
            try:
                await self.keeper.run()
            except LeaseLost:
                log.warning("controller lease lost", controller=self.name)
                self.is_leader = False
                self.election.token = None
                retry = Retry("controller lease", self._etcd_away_policy(), logger=log,
                              controller=self.name)
                while True:
                    try:
                        await self.keeper.grant()
                        await self._announce()
                        break
                    except RECOVERABLE as exc:  # e.g. the new lease expired already
                        await retry.failed(exc)
                retry.succeeded()

    def _etcd_away_policy(self) -> RetryPolicy:
        """Granting a lease again, campaigning again: forever, from 0.1 s doubling up to
        half a heartbeat, jittered down (never slower than half a heartbeat, as before the
        one retry policy); a warning from the first failure, rate-limited."""
        wait = self.config.timing.heartbeat / 2
        return RetryPolicy(first=min(0.1, wait), cap=wait, jitter=0.5, warn_after=1,
                           reset_after=self.config.timing.heartbeat)

    @property
    def api_url(self) -> str:
        """Where agents reach this controller's API (for failsafe questions)."""
        return f"{self.config.api.scheme}://{self.config.api.listen}"

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        """For ``GET /v1/failsafe``: 'available', 'unavailable' or 'recovering' (see
        ControllerFailsafe). ``cluster``: the identity the asking agent knows ("ID/GEN")."""
        known = self.trust.known
        return await self.failsafe.probe(
            cluster, None if known is None else (known.id, known.generation))

    @property
    def failsafe_hold(self) -> float:
        """How long a promise of ``failsafe_probe`` holds our failovers."""
        return self.failsafe.hold

    async def _announce(self) -> None:
        assert self.keeper.lease_id is not None
        await self.store.put(self.keys.controller(self.name),
                             codec.encode({"api": self.api_url, "auth": self.api_auth.mine
                                           .to_dict()}), lease=self.keeper.lease_id)

    async def _until_eligible(self) -> None:
        """Failsafe rule 3: lead only once no agent can be relying on a set without us."""
        logged = False
        while not self.failsafe.may_lead(self.cache.snapshot()):
            if not logged:
                log.info("not yet eligible to lead (failsafe set)", controller=self.name)
                logged = True
            await asyncio.sleep(0.5)

    async def _lead(self) -> None:
        """Campaign; while leader run reconcile cycles; on losing leadership, campaign again."""
        retry = Retry("election", self._etcd_away_policy(), logger=log, controller=self.name)
        while True:
            try:
                await self._until_eligible()
                await self.election.campaign(lambda: self.keeper.lease_id
                                             if self.keeper.valid() else None)
                self.is_leader = True
                retry.succeeded()
                await self.events.append(Event(ts=time.time(), kind="leader-elected",
                                               message=f"controller {self.name} is leader"))
                # beside the cycles, never before the first: a term's first cycle may be a
                # failover's, and an index not yet written costs only the submits a scan
                indexing = asyncio.create_task(self._index_names())
                try:
                    await self._reconcile_loop()
                finally:
                    indexing.cancel()
                    indexing.add_done_callback(retrieve_outcome)
            except NotLeader:
                log.warning("leadership lost", controller=self.name)
            except RECOVERABLE as exc:
                await retry.failed(exc)
            finally:
                self.is_leader = False

    async def _index_names(self) -> None:
        """Give workloads without their name key that key, once per term, beside the cycles
        (``hafo.store.name_index``): a submit of a new name then reads one key, not every
        workload. Not done (etcd away, or a store not to be trusted as the cluster, which
        gets no write until an operator decides): submits keep reading every workload."""
        if self.store_problem():
            return
        try:
            result = await ensure_name_index(self.store, self.keys)
        except RECOVERABLE as exc:
            log.warning("name index not written", error=type(exc).__name__)
            return
        if result.written or not result.complete:
            log.info("name index", written=result.written, complete=result.complete,
                     shared=list(result.shared[:10]))

    async def _reconcile_loop(self) -> None:
        written = 0
        self.metrics.new_term()
        self.history.new_term()
        self.fair_share.new_term()
        self.conditions.new_term()
        self.idle_since, self.last_demand = {}, None
        self.autoscaler.new_term()
        while True:
            if not self.keeper.valid():
                self.election.token = None
                raise NotLeader("lease deadline passed")
            if self.store_problem() or self.failsafe.clock() < self.hold_until:
                # Not the cluster we knew (etcd lost its data, an old snapshot, another
                # etcd): no decision on its view until an operator decides (hafo restore);
                # the agents keep their work meanwhile, on our promises, and once it is the
                # cluster again, no decision until the last of those promises ran out.
                written = 0  # the revisions of what we wrote may be another history's
                await asyncio.sleep(TICK)
                continue
            if self.cache.revision >= written:
                started = time.monotonic()
                snapshot = self.cache.snapshot()
                self.cache.changed.clear()
                now = self.clock()
                snapshot = self.conditions.decide(snapshot, now)  # shared faults
                # The workloads a cycle can act on: a cluster's thousands of ended ones are
                # read by nothing below but the histories (hafo.decisions.live_view).
                quiet = dormant(snapshot)
                live = live_view(snapshot, quiet)
                self.seen = observe(self.seen, live, now)
                usage_history = await self.fair_share.before_cycle(live, now)
                # In a thread: a big cycle (thousands of placements) must not starve the
                # lease keepalives on this loop. The snapshot is frozen.
                plan = await asyncio.to_thread(
                    reconcile, live, now,
                    allow_failover=self.failsafe.failover_allowed(),
                    strategy=self.config.placement_strategy,
                    spares=self.config.placement.spares, seen=self.seen,
                    min_runtime=self.config.fair_sharing.min_runtime,
                    usage_history=usage_history)
                self.cycles += 1
                try:
                    await self.failsafe.maintain_set(self.election, snapshot)
                except TRANSIENT as exc:
                    log.warning("failsafe set not updated", error=type(exc).__name__)
                applied = None
                if plan:
                    try:
                        written = max(written, await apply_plan(
                            self.election, self.keys, self.events, plan, snapshot,
                            epoch_base=self.trust.known.epoch_base if self.trust.known
                            else 0))
                        applied = plan
                    except TRANSIENT as exc:
                        log.warning("apply failed: etcd unavailable", error=type(exc).__name__)
                    except StoreError:
                        # Decisions are written with their events, under the event lease: if
                        # that lease is gone, the next cycle writes them under a new one.
                        if not await self.events.forget_if_gone():
                            raise
                        log.warning("apply failed: the event lease is gone; granted anew")
                self.metrics.cycle(live, now, applied, time.monotonic() - started)
                self.fair_share.after_plan(applied, live)
                await self.fair_share.save(self.election, now)
                # After the plan: recording what happened never delays deciding about it.
                await self.history.step(self.election, snapshot, now, quiet)
                await self.conditions.say()
                self._elastic_step(live, now)
                if plan:
                    continue
            await wait_event(self.cache.changed, TICK)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until cancelled."""
        await self.keeper.grant()
        await self.trust.check()
        self.trusted_at = self.keeper.clock()
        await self._announce()
        await self.cache.load()
        await self.api_auth.check()
        self.connected = True
        if ready is not None:
            ready.set()
        await run_all(lease=self._keep_lease(), follow=self.cache.follow(), lead=self._lead(),
                      confirm=self.cache.confirm_expiries(), trust=self._watch_trust(),
                      api_auth=self.api_auth.watch(RECOVERABLE))

    async def _watch_trust(self) -> None:
        """Read the store's identity every ``TRUST_EVERY``: say once when the store stops
        or starts again being the cluster (log, event, metric); on an operator's accept,
        load the cache afresh from the accepted store."""
        said = before = ""
        while True:
            try:
                await self.trust.check()
            except RECOVERABLE:
                await asyncio.sleep(TRUST_EVERY)
                continue
            if self.trust.trusted:
                self.trusted_at = self.keeper.clock()
            if self.trust.accepted:
                self.failsafe.contested = ""
                self.cache.watched.forget()  # another history: its revisions may be lower
                self.election.forget()  # a standby's watch of the leader key, likewise
                with contextlib.suppress(*RECOVERABLE):
                    await self.cache.load()
            problem = self.store_problem()
            if before and not problem:
                # Every agent that kept work on our word ("unavailable", then "recovering"
                # for the recovery window) has it only until the promise it was given ends.
                failsafe = self.failsafe
                self.hold_until = max(failsafe.quiet_until, failsafe.unavailable_at
                                      + failsafe.recovery + failsafe.hold)
            if problem != said:
                kind, message = (("store-untrusted", f"controller {self.name}: etcd is not "
                                  f"the cluster it knew: {problem}; no decisions") if problem
                                 else ("store-trusted", f"controller {self.name}: the store "
                                       "is the cluster again; deciding"))
                with contextlib.suppress(*RECOVERABLE):
                    await self.events.append(Event(ts=time.time(), kind=kind,
                                                   message=message))
                    said = problem
            before = problem
            await asyncio.sleep(TRUST_EVERY)

    async def close(self) -> None:
        """Resign leadership and release the lease (clean shutdown)."""
        await self.autoscaler.close()
        with contextlib.suppress(*TRANSIENT, NotLeader):
            await self.election.resign()
        with contextlib.suppress(*TRANSIENT):
            await self.keeper.revoke()
        await self.store.close()

    def info(self) -> dict[str, Any]:
        """For logs and the API."""
        return {"name": self.name, "leader": self.leading(), "cycles": self.cycles,
                "revision": self.cache.revision}
