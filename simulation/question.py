"""One question's agent graph in the simulator, as router/orchestrator.py, agent_runner.py and
incremental.py run it: every agent's output streams token by token; a successor is sent whole
once its precursors ended (blocking), once every agent of the layers before its own ended
(blocking_layer), or warmed as its prompt grows and then sent for the uncached tail (pipelined:
the static prefix first, then, one warm-up at a time and only through the worker's gate, all
that arrived meanwhile once it is at least `min_chunk_tokens`). Each request: a critical prefill
on the agent's prefill worker, the PD path's fixed cost, then decoding on its decode worker.
The workers are chosen as the shell router chooses them (router/request_split.py), as requests
go out: a warming successor's prefill
worker at its start, every other prefill worker and every decode worker at the final request; a
request is open on its prefill worker until the prefill reply, on its decode worker until its last
token. Early exit: agents the trace marks killed (or that an exit rate draws) are cut once
`min_completed` of their successor's precursors completed; their slot leaves the prompt."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import simpy

from experiments.results import AgentTrace
from router.priority import start_order
from router.topology import critical_path_chance
from simulation.prefix_cache import Prompt, common_prefix, length
from simulation.signal import Signal
from simulation.workload import QuestionWork


@dataclass
class AgentState:
    tokens: int = 0  # its output's tokens: 1 once its first token came, all once it ended
    ended: bool = False
    killed: bool = False
    started: bool = False  # its final request went out
    trace: dict = field(default_factory=dict)
    seq: object = None  # its decode Sequence, once decoding
    decoder: object = None


class QuestionRun:
    def __init__(
        self, sim, work: QuestionWork, mode: str, early_exit: bool, rng: random.Random
    ) -> None:
        self.sim, self.env, self.work, self.mode = sim, sim.env, work, mode
        self.cfg = sim.configs[work.config]
        self.early_exit = early_exit and (self.cfg.early_exit.enabled or sim.exit_rate is not None)
        self.rng = rng
        # Its requests' rank at the workers and gates: the order questions started under
        # workflow priority, else 0 for all (FCFS).
        self.rank = next(sim.question_order) if sim.workflow_priority else 0
        self.t0 = self.env.now
        self.state = {a: AgentState() for a in work.agents}
        self.dropped: dict[str, set[str]] = {a: set() for a in work.agents}
        self.readers: dict[str, list[str]] = {a: [] for a in work.agents}
        for a, w in work.agents.items():
            for p in w.precursors:
                self.readers[p].append(a)
        # Per agent: `tokens` fires when a precursor of it streams, ends or is dropped (its
        # prompt may grow); `ends` only when one ends or is dropped; `any_end` at every end.
        # A waiting successor is woken by its precursor's tokens only once enough came to matter
        # (`_wake_after`), not for each (a token streams every few ms).
        self._tokens = {a: Signal(self.env) for a in work.agents}
        self._ends = {a: Signal(self.env) for a in work.agents}
        self._any_end = Signal(self.env)
        self._doomed = self._draw_exits()

    # --- the answer cache's view ------------------------------------------------------------
    def _streamed(self, aid: str) -> None:
        for r in self.readers[aid]:
            self._tokens[r].fire()

    def _output_tokens(self, aid: str) -> int:
        """The tokens `aid` has streamed so far."""
        st = self.state[aid]
        if st.seq is not None and not st.ended:
            return 1 + st.decoder.decoded(st.seq)
        return st.tokens

    def _wake_after(self, aid: str, tokens: int) -> None:
        """Fire `aid`'s tokens signal once its prompt may have grown by `tokens`: only the first
        precursor still running grows it (the others' outputs come after it), by a token a
        step; an end, a drop or that precursor's first token fire it anyway."""
        w = self.work.agents[aid]
        for p in w.precursors:
            st = self.state[p]
            if p in self.dropped[aid] or st.ended:
                continue
            if st.seq is not None:
                count = st.decoder.decoded(st.seq) + tokens
                st.decoder.when_decoded(st.seq, count, self._tokens[aid].fire)
            return

    def _ended_signal(self, aid: str) -> None:
        for r in self.readers[aid]:
            self._tokens[r].fire()
            self._ends[r].fire()
        self._any_end.fire()

    def prompt(self, aid: str) -> tuple[Prompt, bool]:
        """The longest prefix of `aid`'s prompt known now, and whether it is complete."""
        w = self.work.agents[aid]
        q = self.work.qid
        kept = [p for p in w.precursors if p not in self.dropped[aid]]
        shortest_first = self.cfg.slot_order == "shortest_first"
        if shortest_first:  # the order the router's commits reach (its lengths known here)
            kept = self._shortest_first(kept)
        # Keys: a static piece by its text (the head with this question), an output by its agent.
        segs = [(f"{q}|{w.piece_keys[0]}", w.pieces[0])]
        for pos, p in enumerate(kept):
            st = self.state[p]
            if shortest_first and not st.ended and pos < len(kept) - 1:
                # The router commits a position to a finished answer once every one still
                # streaming has streamed at least as many tokens; the simulator commits it when
                # it finishes (it knows every length), a little earlier where a longer answer
                # started late.
                return tuple(segs), False
            segs.append((f"{q}|out|{p}", self._output_tokens(p)))
            if not st.ended:
                return tuple(segs), False
            i = pos + 1 if pos < len(kept) - 1 else len(w.pieces) - 1
            segs.append((w.piece_keys[i], w.pieces[i]))
        if not kept and w.precursors:
            segs.append((w.piece_keys[-1], w.pieces[-1]))
        return tuple(segs), True

    def _shortest_first(self, agents: list[str]) -> list[str]:
        """`agents` by output length, template order among equals (sort is stable)."""
        return sorted(agents, key=lambda p: self.work.agents[p].output_tokens)

    # --- running ------------------------------------------------------------------------------
    def run(self):
        """simpy process: the whole question; returns the rows' agents and e2e."""
        # The router keeps the config's order under aggregator bypass too (not simulated).
        order = self.work.start_order or start_order(
            self.cfg,
            self.sim.critical_path_first,
            self.early_exit or self.cfg.aggregator_bypass.enabled,
        )
        procs = [self.env.process(self._agent(a)) for a in order if a in self.work.agents]
        yield simpy.AllOf(self.env, procs)
        e2e = self.state[self.work.final].trace["end_s"]
        agents = {}
        for a, w in self.work.agents.items():
            st = self.state[a]
            kept = [p for p in w.precursors if p not in self.dropped[a]]
            if self.cfg.slot_order == "shortest_first":
                kept = self._shortest_first(kept)
            agents[a] = AgentTrace(
                model=w.model, layer=w.layer, slot_order=kept, killed=st.killed, **st.trace
            )
        return agents, e2e

    def _now(self) -> float:
        return self.env.now - self.t0

    def _ended(self, agents) -> bool:
        return all(self.state[p].ended for p in agents)

    def _wait_until(self, cond, signal: Signal):
        while not cond():
            yield signal.wait()

    def _agent(self, aid: str):
        w = self.work.agents[aid]
        st = self.state[aid]
        st.trace["start_s"] = self._now()
        rep = self.sim.replicas[w.model]
        warms = bool(w.precursors) and self.mode == "pipelined"
        warms = warms and self.cfg.incremental_prefill.enabled
        # As router/agent_runner.py: a warming successor's prefill worker is chosen as its
        # warm-ups start, every other request's when it is sent.
        on_prefill = rep.choose("prefill") if warms else None
        if w.precursors:
            if on_prefill is not None:
                prefill = rep.prefill[on_prefill.index]
                yield from self._warm(aid, prefill, self.sim.gates[prefill.name])
            elif self.mode == "blocking_layer":
                earlier = [a for a, x in self.work.agents.items() if x.layer < w.layer]
                yield from self._wait_until(lambda: self._ended(earlier), self._any_end)
            else:
                yield from self._wait_until(lambda: self._ended(w.precursors), self._ends[aid])
            yield from self._wait_until(lambda: self.prompt(aid)[1], self._ends[aid])
        if st.killed:
            if on_prefill is not None:
                on_prefill.release()
            return self._end(aid)
        on_prefill = on_prefill or rep.choose("prefill")
        on_decode = rep.choose("decode")
        prefill, decoder = rep.prefill[on_prefill.index], rep.decode[on_decode.index]
        st.trace["prefill_worker"], st.trace["decode_worker"] = prefill.name, decoder.name
        gate = self.sim.gates[prefill.name]
        prompt, _ = self.prompt(aid)
        st.started = True
        st.trace["final_request_s"] = self._now()
        dgate = self.sim.device_gates[decoder.name]
        dgate.decode_started(decoder.name, self)
        # Every request holds its prefill worker's gate until its prefill is over.
        gate.hold()
        self.sim.router.request()
        # The prefill starts only once the decode worker admitted the request (PD bootstrap).
        slot = decoder.slots.request(priority=self.rank)
        yield slot
        if not st.killed:  # an aborted request leaves the queue
            job = prefill.submit(prompt, critical=True, rank=self.rank)
            yield job.done
            st.trace["prompt_tokens"], st.trace["cached_tokens"] = length(prompt), job.cached
        if not st.killed:
            yield self.env.timeout(self.sim.profile.models[w.model].pd_seconds(length(prompt)))
        # The router learns the prefill is over from the first token or the prefill worker's
        # reply, which comes once the KV was sent: after the PD hop.
        gate.release()
        on_prefill.release()
        if not st.killed:
            st.trace["first_token_s"] = self._now()
            st.tokens = 1
            self._streamed(aid)
            st.decoder = decoder
            st.seq = decoder.start(length(prompt) + 1, w.output_tokens - 1)
            yield st.seq.done
            st.tokens = 1 + decoder.decoded(st.seq)
        decoder.slots.release(slot)
        on_decode.release()
        dgate.decode_ended(decoder.name, self)
        return self._end(aid)

    def _end(self, aid: str) -> None:
        st = self.state[aid]
        st.ended = True
        st.trace["end_s"] = self._now()
        self._ended_signal(aid)
        if not st.killed and self.early_exit:
            self._decide_exits(aid)

    def _warm(self, aid: str, prefill, gate):
        """router/incremental.py's WarmupLoop (adaptive or fixed chunks) until the prompt is
        complete: with `warm_before_cap`, one more warm-up as the last precursor nears its cap;
        and the prompt goes out as soon as it is complete, a warm-up in flight left to reply."""
        policy = self.cfg.incremental_prefill
        warmed: Prompt | None = None
        # The router's gate order: its question's rank, then the order successors started.
        key = (self.rank, next(self.sim.warm_order))
        benefit = critical_path_chance(self.cfg, aid)  # weighed by a shared device's gate
        step = policy.min_chunk_tokens if policy.chunk_policy == "adaptive" else policy.chunk_tokens
        timed_to, warm_s = None, None
        while True:
            ready, complete = self.prompt(aid)
            if complete:
                gate.unqueue(key)
                return
            last_open = self._last_open(aid)
            to_lead = None if last_open == timed_to else self._tokens_to_lead(last_open, warm_s)
            last = warmed is not None and to_lead is not None and to_lead <= 0
            if warmed is None:
                chunk = ready
            else:
                new = length(ready) - common_prefix(warmed, ready)
                chunk = ready if (new >= step or last) and new > 0 else None
            if chunk is None:
                gate.unqueue(key)  # nothing to send: let the others go first
                # The next chunk is `step - new` tokens away, the cap's lead maybe sooner.
                wake = step - new if to_lead is None else min(step - new, max(1, to_lead))
                self._wake_after(aid, wake)
                yield self._tokens[aid].wait()
                continue
            if not gate.try_enter(key, benefit):
                # Only its turn at the gate or the prompt completing changes what happens next.
                yield self._ends[aid].wait() | gate.queue(key, benefit)
                continue
            if last:
                timed_to = last_open
            self.sim.router.request()
            sent = self.env.now
            job = prefill.submit(chunk, critical=False, rank=self.rank)
            while not job.done.triggered:
                yield job.done | self._ends[aid].wait()
                if policy.final_beside_warmup and not job.done.triggered and self.prompt(aid)[1]:
                    self.env.process(self._warm_reply(aid, job, gate))
                    gate.unqueue(key)
                    return
            self._warm_reply_done(aid, gate)
            warmed, warm_s = chunk, self.env.now - sent

    def _warm_reply(self, aid: str, job, gate):
        """A warm-up still in flight when its prompt completed: it replies beside the final
        request."""
        yield job.done
        self._warm_reply_done(aid, gate)

    def _warm_reply_done(self, aid: str, gate) -> None:
        gate.leave()
        self.state[aid].trace["warmups"] = self.state[aid].trace.get("warmups", 0) + 1

    def _last_open(self, aid: str) -> str | None:
        """The precursor `aid`'s prompt waits for when it is the only kept one still running."""
        running = [
            p
            for p in self.work.agents[aid].precursors
            if p not in self.dropped[aid] and not self.state[p].ended
        ]
        return running[0] if len(running) == 1 else None

    def _tokens_to_lead(self, precursor: str | None, warm_s: float | None) -> int | None:
        """Tokens until `precursor` is within one warm-up (`warm_s` at its rate so far) of its
        cap, where the router times its last warm-up (`warm_before_cap`); None where it does
        not (no cap, no rate or no warm-up time yet)."""
        if precursor is None or warm_s is None or not self.cfg.incremental_prefill.warm_before_cap:
            return None
        cap = self.cfg.sampling_of(precursor).max_new_tokens
        first = self.state[precursor].trace.get("first_token_s")
        streamed = self._output_tokens(precursor)
        if cap is None or first is None or streamed <= 1 or self._now() <= first:
            return None
        rate = (streamed - 1) / (self._now() - first)
        return cap - self.cfg.incremental_prefill.cap_lead(rate, warm_s) - streamed

    # --- early exit -----------------------------------------------------------------------------
    def _draw_exits(self) -> tuple[set[str], set[str]]:
        """(agents the trace says early exit cut, successors whose cluster exits by a draw at the
        exit rate: once `min_completed` of its precursors completed, the rest are cut)."""
        if not self.early_exit:
            return set(), set()
        doomed = {a for a, w in self.work.agents.items() if w.killed}
        exiting = set()
        if self.sim.exit_rate is not None and not doomed:
            n = self.cfg.early_exit.min_completed
            exiting = {
                a
                for a, w in self.work.agents.items()
                if len(w.precursors) > n and self.rng.random() < self.sim.exit_rate
            }
        return doomed, exiting

    def _decide_exits(self, completed: str) -> None:
        n = self.cfg.early_exit.min_completed
        doomed, exiting = self._doomed
        for succ in self.readers[completed]:
            pre = self.work.agents[succ].precursors
            done = [p for p in pre if self.state[p].ended and not self.state[p].killed]
            if len(done) < n:
                continue
            running = [p for p in pre if not self.state[p].ended]
            cut = running if succ in exiting else [p for p in running if p in doomed]
            if not cut:
                continue
            self.dropped[succ].update(cut)
            for p in cut:
                if all(p in self.dropped[r] for r in self.readers[p]):
                    self._kill(p)
            self._tokens[succ].fire()
            self._ends[succ].fire()

    def _kill(self, aid: str) -> None:
        st = self.state[aid]
        st.killed = True
        if st.seq is not None:
            st.decoder.cancel(st.seq)
