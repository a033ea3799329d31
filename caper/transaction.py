"""caper.run: one command, run once, in a copy-on-write view of the machine.

The stages, in order: snapshot -> pre-execute under the tracer -> approve ->
commit or roll back. Data flows one way. Any failure before the commit is a
block: nothing of the run reaches the host.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from caper.commit.engine import commit
from caper.commit.journal import SET_ASIDE
from caper.commit.plan import plan_changes
from caper.config import Config, config_path, load_config
from caper.errors import (
    BtrfsError, CaperError, CommitConflict, CommitError, CommitIncomplete, ConfigError, ReportError,
)
from caper.fs import mountinfo
from caper.held import hold
from caper.judge import (ApprovalRequest, Approver, Decision, blocks_every_credential_read,
                         get_approver, resolve_unsure)
from caper.judge.session import TAINT_KIND, open_sessions
from caper.report.build import Report, RunFacts, build, notes
from caper.report.content import RunTree
from caper.report.secrets import (Protected, ProtectedPattern, default_patterns, glob_quote,
                                  protected_for)
from caper.report.stores import GIT_CONFIG, stores
from caper.report.workspace import find_workspace
from caper.request import RunRequest
from caper.sandbox.events import End, Output, RunResult
from caper.sandbox.inherit import Caller
from caper.sandbox.limits import DEFAULT_MAX_MEMORY, DiskGuard
from caper.sandbox.netproxy import NetRecord, Proxy
from caper.sandbox.trace import CredentialStop, trace
from caper.state import KEPT_S, known_state_dirs, state_dir as checked_state_dir, workspace_lock
from caper.upkeep import tidy
from caper.view.btrfs import BtrfsConflict, BtrfsSnapshot, is_subvolume
from caper.view.overlay import OverlaySnapshot, later, over_keep_quota

# Exit status of `caper run` when the command's run did not count (blocked,
# failed closed, or a conflict). A command's own status is passed through.
EXIT_NOT_COMMITTED = 125


@dataclass
class RunOutcome:
    """What `caper run` returns: the fields of its --json output."""
    decision: str
    reason: str
    exit_code: int | None
    stdout: Output                  # raw only when committed; else redacted (as the report)
    stderr: Output
    report: "Report | None"          # None: the command was not run (session stopped)
    timings: dict[str, float]
    committed: bool = False
    kept_upper: str | None = None   # a conflicting run's changes, kept for the user
    approver: str = ""              # who decided
    confidence: float | None = None
    boundary: str | None = None
    ask: bool = False               # a human should decide (on_unsure = "ask")
    steps: tuple[str, ...] = ()     # auto: who was asked, verdict and time each
    held: str | None = None         # held for a human: `caper commit <held>` applies it
    notes: tuple[str, ...] = ()     # for the caller: how this run differed from a native one
    # Not committed after reading a credential: the agent gets the sealed
    # report and reason (to_json, card), stdout/stderr are sizes only;
    # `report` and `reason` stay the approver's, for caper and its API.
    withheld: bool = False

    @property
    def output(self) -> str:
        """What the user would have seen: stdout, then stderr (decoded)."""
        return (self.stdout.text() + self.stderr.text()).decode(errors="replace")

    @property
    def agent_reason(self) -> str:
        """The reason the agent gets: a sealed run's approver may have quoted
        what the run chose (a file name, a line of its output)."""
        from caper.report.build import SEALED_WHY
        if not self.withheld:
            return self.reason
        what = (f"held for a human (`caper commit {self.held}` applies it, `caper discard "
                f"{self.held}` drops it)" if self.held else "blocked, nothing was committed")
        return f"{what}; the reason of {self.approver or 'the approver'} is withheld: {SEALED_WHY}"

    @property
    def agent_report(self) -> "Report | None":
        """The report the agent gets (Report.sealed when withheld)."""
        return self.report.sealed() if self.withheld and self.report else self.report

    def card(self) -> str | None:
        return self.agent_report.card() if self.report is not None else None

    def to_json(self) -> dict:
        """What the agent gets, by any front door."""
        report = self.agent_report
        # Sealed: which rule fired, how sure, the steps and the notes are each
        # a choice the run made after its read (a bit or more a run).
        sealed = self.withheld
        return {
            "decision": self.decision, "reason": self.agent_reason,
            # A status is a number the run chose: 8 bits a run when sealed.
            "exit_code": None if sealed else self.exit_code,
            "committed": self.committed, "approver": self.approver,
            "confidence": None if sealed else self.confidence,
            **({"boundary": self.boundary} if self.boundary and not sealed else {}),
            **({"ask": True} if self.ask else {}),
            **({"steps": list(self.steps)} if self.steps and not sealed else {}),
            **({"held": self.held} if self.held else {}),
            **({"notes": list(self.notes)} if self.notes and not sealed else {}),
            "stdout": self.stdout.text().decode(errors="replace"),
            "stderr": self.stderr.text().decode(errors="replace"),
            "stdout_bytes": self.stdout.total, "stderr_bytes": self.stderr.total,
            "report": report.to_dict() if report else None, "timings": self.timings,
            **({"kept_upper": self.kept_upper} if self.kept_upper else {}),
        }


def run(command: Sequence[str] | str, *, state_dir: str | None = None,
        history: Sequence[dict] = (), config: "Config | None" = None,
        still_wanted: "Callable[[], bool] | None" = None, **options) -> RunOutcome:
    """Run command once in a snapshot, ask the approver, then commit or roll back.

    options: a RunRequest's (caper.request.OPTIONS: task, approver,
    workspace, backend, timeout, cwd, env, session, on_unsure, max_memory,
    caller, task_from_transcript). The rest is this process's, never a
    caller's: state_dir; history (the approver's, when there is no
    session); config (default: config.toml's); still_wanted, asked just
    before a commit: False (the caller went away) rolls the run back."""
    return run_request(RunRequest(command, **options), state_dir=state_dir, history=history,
                       config=config, still_wanted=still_wanted)


def run_request(request: RunRequest, *, state_dir: str | None = None,
                history: Sequence[dict] = (), config: "Config | None" = None,
                still_wanted: "Callable[[], bool] | None" = None) -> RunOutcome:
    """run's work, for a request built already (the gate's, the CLI's).

    session: the agent session this command belongs to (history for the
    approver, the circuit breaker); task_from_transcript: the task was read
    from a file the agent can write (it is evidence, never a reason to be
    less strict: caper.judge.policy); files an approved run wrote secrets into
    are tainted for every later run. on_unsure: overrides the
    configuration's (ask: an unsure run is held for a human, see
    caper.held). max_memory: bytes for the whole sandbox (default:
    config.toml's [limits], else caper.sandbox.limits.DEFAULT_MAX_MEMORY).
    caller: the context the command inherits (caper.sandbox.inherit: umask,
    limits, groups, the shell of a command string); None: this process's,
    with cwd and env as given. allow_net: hosts the run may reach through
    caper's proxy (caper.sandbox.netproxy), besides config.toml's [network]."""

    env = request.env
    config = config or load_config(env=env)
    if request.on_unsure is not None:
        config = config.model_copy(update={"on_unsure": request.on_unsure})
    judge = get_approver(request.approver, config, env)
    cwd = os.path.realpath(request.cwd or os.getcwd())
    if not os.path.isdir(cwd):
        raise ConfigError(f"working directory does not exist: {cwd}")
    workspace = os.path.realpath(request.workspace) if request.workspace else find_workspace(cwd)
    if not os.path.isdir(workspace):
        raise ConfigError(f"workspace does not exist: {workspace}")
    state_dir = checked_state_dir(state_dir)
    timings: dict[str, float] = {}
    run_env = os.environ if env is None else env
    home = run_env.get("HOME")
    request = request.replace(
        cwd=cwd, workspace=workspace,
        caller=request.caller or Caller.here(cwd=cwd, env=dict(run_env)),
        max_memory=request.max_memory or config.limits.max_memory or DEFAULT_MAX_MEMORY)

    with open_sessions(state_dir) as sessions:
        session = request.session
        if session is not None:
            stopped = sessions.tripped(session)
            if stopped:
                empty = Output(b"", b"", 0)
                return RunOutcome(decision="block", reason=stopped, exit_code=None, stdout=empty,
                                  stderr=empty, report=None, timings=timings, approver="caper")
            history = sessions.history(session, config.llm.max_history or 1)
        # Files an earlier approved run wrote secrets into are credentials too.
        tainted = tuple(ProtectedPattern(glob_quote(p), f"{TAINT_KIND}:{k}")
                        for p, k in sessions.tainted().items())
        outcome = _run(request, judge, state_dir, tuple(history), config, tainted, home,
                       timings, still_wanted)
        if session is not None:
            verdict = "allow" if outcome.committed else "held" if outcome.held else "block"
            sessions.record(session, request.text, verdict, outcome.approver, outcome.reason)
        if outcome.committed and outcome.report is not None and outcome.report.secret_files:
            sessions.taint(outcome.report.secret_files, session)
        return outcome


def _run(request: RunRequest, judge, state_dir: str, history: tuple, config: "Config",
         tainted: tuple, home: str | None, timings: dict,
         still_wanted: "Callable[[], bool] | None") -> RunOutcome:
    """The stages, for a request whose cwd, workspace, caller and
    max_memory are resolved."""
    command, text, workspace, backend = request.command, request.text, request.workspace, \
        request.backend
    env, cwd, caller = request.env, request.cwd, request.caller
    allow = config.network.allowlist(list(request.allow_net))

    # The workspace's own snapshot is btrfs's where it is a subvolume (listing
    # its changes needs root); everything else, and every other case, overlay.
    btrfs = backend == "btrfs" or (backend == "auto" and os.geteuid() == 0
                                   and is_subvolume(workspace))
    if btrfs and not is_subvolume(workspace):
        raise ConfigError(f"--backend btrfs: {workspace} is not a btrfs subvolume "
                          "(or btrfsutil is not installed)")

    # interrupted commits first; then dead, expired and kept scratch. A record
    # set aside as not caper's is said: someone wrote into the state directory.
    set_aside = tuple(f"caper recover: {line}" for line in tidy(state_dir)
                      if SET_ASIDE in line)
    with workspace_lock(state_dir, workspace):
        t = time.perf_counter()
        entries = mountinfo.read()
        bsnap = BtrfsSnapshot.create(workspace, state_dir, entries) if btrfs else None
        work_dirs = _work_dirs(None if bsnap else workspace, home,
                               os.environ if env is None else env)
        try:
            snap = OverlaySnapshot.create(state_dir, userxattr=os.geteuid() != 0,
                                          binds=[(bsnap.path, workspace)] if bsnap else [],
                                          work_dirs=work_dirs, entries=entries,
                                          other_state=known_state_dirs(os.environ if env is None
                                                                       else env))
        except BaseException:
            if bsnap:
                bsnap.discard()
            raise
        # The overlay must not commit what the btrfs snapshot holds.
        hidden = snap.hidden + ([workspace, bsnap.path] if bsnap else [])
        timings["snapshot_ms"] = (time.perf_counter() - t) * 1000
        kept: str | None = None   # a conflicting run's changes, left for the user
        committed = workspace_swapped = False
        commit_notes: tuple[str, ...] = ()
        # caper's own config may hold the approver's key: reading it is a credential read.
        config_file = config_path(env)
        own_config = (ProtectedPattern(os.path.realpath(config_file), "caper-config"),)
        # Files that are credential stores by what they hold now (a token in .git/config).
        by_content = stores(home, workspace, (os.environ if env is None else env).get(
            "XDG_CONFIG_HOME"))
        protected = protected_for(default_patterns() + tuple(config.protected_patterns())
                                  + tainted + own_config + by_content, home, workspace,
                                  entries)
        roots = [(layer.mount_point, layer.upper) for layer in snap.layers]
        roots += [(workspace, bsnap.path)] if bsnap else []
        tree = RunTree.of(roots)
        # Where the verdict on a credential read is a block already, the run
        # ends at that read: nothing after it (the call's time, the page
        # cache, bytes through an allowed host) can carry the value out.
        stop = _credential_stop(protected, tree) \
            if blocks_every_credential_read(judge, config.on_unsure) else None
        try:
            t = time.perf_counter()
            proxy = Proxy(allow, credentials=protected, timeout=request.timeout) \
                if allow else None
            command_env = config.command_env(os.environ if env is None else env)
            try:
                tr = trace(command, cwd=cwd, env=command_env | (proxy.env(command_env) if proxy else {}),
                           caller=caller, timeout=request.timeout, mounts=snap.mounts,
                           new_root=snap.stage, not_before_ns=snap.not_before_ns,
                           disk_guard=DiskGuard.for_state_dir(state_dir),
                           max_memory=request.max_memory, proxy=proxy.start() if proxy else None,
                           stop_at=stop, **config.limits.trace_kwargs())
                events, result = tr.run()
            finally:
                net = proxy.close() if proxy else NetRecord()
            try:
                changes, unplanned = plan_changes(snap.layers, exclude=hidden), None
                workspace_changes = bsnap.changes() if bsnap else []
            except (CommitError, BtrfsError) as e:   # reported and blocked, never committed
                changes, workspace_changes, unplanned = [], [], e
            timings["run_ms"] = (time.perf_counter() - t) * 1000

            t = time.perf_counter()
            try:
                report = build(RunFacts(
                    command=text, events=events, result=result,
                    changes=changes + workspace_changes, workspace=workspace,
                    tree=tree, home=home, protected=protected,
                    backend="btrfs" if bsnap else "overlay", held=tuple(snap.held),
                    aliases=tuple(snap.aliases), net=net))
            except CaperError:
                raise
            except Exception as e:   # a bug here must block, not commit unjudged
                raise ReportError(f"building the effect report failed: {e!r}") from e
            timings["report_ms"] = (time.perf_counter() - t) * 1000

            t = time.perf_counter()
            asked = ApprovalRequest(text, request.task, report, history, cwd=cwd,
                                    workspace=workspace, home=home, protected=protected,
                                    task_from_transcript=request.task_from_transcript,
                                    config_file=config_file,
                                    xdg_config_home=(os.environ if env is None else env).get(
                                        "XDG_CONFIG_HOME", ""))
            # (reached is None where the tracer stopped without asking: a shared
            # descriptor table, caper.h's stop_at)
            stopped = (stop.reached or ("", "credential")) \
                if stop and result.end == End.CREDENTIAL else None
            decision = (Decision("block", f"stopped at a credential read ({stopped[1]}) before "
                                 "the command got it: the approver blocks every run that reads "
                                 "a credential, so the rest of it was not run and nothing was "
                                 "committed. Boundary: credentials. Safer: leave credential "
                                 "files to the tools that read them where they run, outside "
                                 "commands caper judges", approver="caper",
                                 boundary="credentials")
                        if stopped else
                        Decision("block", f"the run's changes cannot be committed: {unplanned}",
                                 approver="caper") if unplanned else
                        Decision("block", report.late, approver="caper") if report.late else
                        _decide(judge, asked, result, config.on_unsure))
            timings["approve_ms"] = (time.perf_counter() - t) * 1000
            # What the verdict rests on is listed, never aggregated away.
            report = report.pinned(decision.flagged)
            if decision.allowed and still_wanted is not None and not still_wanted():
                decision = Decision("block", "the caller went away before the commit; "
                                             "nothing was committed", approver="caper")

            t = time.perf_counter()
            if decision.allowed:
                try:
                    # The workspace first: its conflict check comes before any change.
                    # (A conflict outside it after that leaves the workspace committed.)
                    if workspace_changes:  # an unchanged snapshot is just dropped
                        bsnap.swap()
                        workspace_swapped = True
                    commit_notes = tuple(commit(snap.layers, state_dir=state_dir,
                                                since_ns=snap.since_ns, exclude=hidden).notes)
                    committed = True
                except BtrfsConflict as e:
                    kept = bsnap.path
                    decision = _not_committed(e, workspace_swapped, f"the run's version is kept "
                                              f"as the snapshot {kept} for {KEPT_S // 86400} days")
                except CommitConflict as e:
                    full = over_keep_quota(state_dir, snap.scratch, config.keep_quota_mb,
                                           config.keep_quota_inodes_pct)
                    kept = None if full else snap.scratch
                    decision = _not_committed(e, workspace_swapped, f"the run's version is not "
                                              f"kept: {full}" if full else f"the run's version "
                                              f"is kept in {kept} (layer*/upper) for "
                                              f"{KEPT_S // 86400} days")
                except CommitIncomplete as e:
                    # Applied, only the clean-up failed: the run counts (caper recover
                    # finishes it). Not applied and not undone: recover undoes it.
                    committed = e.applied
                    commit_notes = (str(e),)
                    if not e.applied:
                        decision = _not_committed(e, workspace_swapped)
                except CommitError as e:  # undone: nothing changed
                    decision = _not_committed(e, workspace_swapped)
            held = None
            full = decision.ask and not bsnap and over_keep_quota(
                state_dir, snap.scratch, config.keep_quota_mb, config.keep_quota_inodes_pct)
            if full:   # held runs must not starve other sessions of space
                decision = replace(decision, decision="block", ask=False,
                                   reason=f"{decision.reason} Not held for a human: {full}.")
            elif decision.ask and not bsnap:   # a human decides later: keep the run
                held = hold(state_dir, snap, hidden, workspace, text, result, report,
                            decision.reason)
                kept = snap.scratch
                decision = replace(decision, reason=f"held for a human: {decision.reason} "
                                                    f"Apply it with `caper commit {held}`, or "
                                                    f"drop it with `caper discard {held}`.")
            timings["commit_ms" if committed else "rollback_ms"] = (time.perf_counter() - t) * 1000
            # Held output is released only with the run: a run that is not
            # committed (blocked, failed, held for a human) shows what the
            # report shows, its secrets redacted, at every front door.
            stdout, stderr = (result.stdout, result.stderr) if committed else \
                (report.redacted_output("stdout"), report.redacted_output("stderr"))
            sealed = not committed and (bool(report.read_credentials) or stopped is not None)
            if sealed:
                # Redaction is verbatim: once a credential was read, an encoded
                # copy can be in any byte, name, size or time the run chose. A
                # committed run returns its output as it was: its approver saw
                # the read. (The call's own wall time still passes: see SECURITY.md.)
                stdout, stderr = Output(b"", b"", 0), Output(b"", b"", 0)
                timings = {}
            return RunOutcome(decision=decision.decision, reason=decision.reason,
                              exit_code=result.exit_code, stdout=stdout,
                              stderr=stderr, report=report, timings=timings,
                              committed=committed, kept_upper=kept, approver=decision.approver,
                              confidence=decision.confidence, boundary=decision.boundary,
                              ask=decision.ask, steps=decision.steps, held=held,
                              notes=set_aside + notes(report) + commit_notes,
                              withheld=sealed)
        finally:
            if kept == snap.scratch:
                snap.keep()
            else:
                snap.discard_later()
            if bsnap and kept == bsnap.path:
                bsnap.keep()
            elif bsnap:   # the old workspace after a swap, else the unused snapshot
                later(bsnap.finish if bsnap.swapped else bsnap.discard)


def _credential_stop(protected: Protected, tree: RunTree) -> CredentialStop:
    """The tracer's stop at the credentials the report counts as read:
    protected's, but a file of settings only (no value to carry, not a
    credential read to the policy) and git's configuration (git reads its
    own at every command; the report counts only other readers, whom the
    tracer cannot tell apart here: judged after the run, as before)."""
    def reaches(name: str, below: bool) -> "tuple[str, str] | None":
        hit = protected.reached(name, below)
        if hit is None or hit[1] == GIT_CONFIG or (not below and tree.settings_only(hit[0])):
            return None
        return hit
    return CredentialStop(protected.stop_globs, protected.translations, reaches,
                          protected.stop_homes, protected.stop_below_home)


def _work_dirs(workspace: str | None, home: str | None, env: Mapping[str, str]) -> list[str]:
    """Where a command is expected to write: its workspace, $HOME, and the
    shared temporary directories ($TMPDIR, /var/tmp; /tmp is a layer of its
    own already)."""
    return [d for d in (workspace, home, env.get("TMPDIR"), "/var/tmp") if d]


def _not_committed(e: CaperError, workspace_swapped: bool, kept: str | None = None) -> Decision:
    where = ("the workspace (btrfs) was committed, changes outside it were not"
             if workspace_swapped else "not committed")
    return Decision("block", f"{where}: {e}" + (f"; {kept}" if kept else ""), approver="caper")


def _decide(judge: "Approver", request: ApprovalRequest, result: RunResult,
            on_unsure: str) -> Decision:
    """Fail closed: a run that did not end by itself, or an approver that
    fails, is a block that says why."""
    if result.end not in (End.EXITED, End.SIGNALED):
        return Decision("block", f"the run did not complete: {result.status}", approver="caper")
    try:
        d = judge.decide(request)
    except Exception as e:  # any failure of the approver blocks
        return Decision("block", f"approver {getattr(judge, 'name', judge)!r} failed ({e}); "
                                 "the failure is not evidence that the command is unsafe",
                        approver="caper")
    if not isinstance(d, Decision) or d.decision not in ("allow", "block", "unsure"):
        return Decision("block", f"approver returned a malformed decision: {d!r}", approver="caper")
    return resolve_unsure(d, on_unsure)
