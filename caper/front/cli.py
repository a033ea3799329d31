"""caper's command line.

    caper run [--task TEXT | --call ID] [--approver auto|policy|llm|allow|block] [--session ID]
              [--backend B] [--timeout S] [--workspace DIR] [--json] [-q]
              -c 'SHELL STRING'   (or -- ARGV...)
    caper session list|reset [ID]
    caper commit|discard ID         (a run held for a human: apply it, or drop it)
    caper serve [--idle S]          (the resident gate; caper run starts it on demand)
    caper hook claude-code|codex|gemini     (an agent's hook: its JSON on stdin)
    caper install|uninstall claude-code|codex|gemini [--project|--user]
    caper doctor [--cwd DIR]        (is caper really in front of each agent? every fix)
    caper mcp                       (an MCP server on stdio: a run_command tool)
    caper demo
    caper recover [--state-dir DIR]
    caper trace [--jsonl] [--timeout S] [--max-pids N] [--raw] -- CMD...
    caper trace [...] -c 'SHELL STRING'

run executes the command once in a copy-on-write snapshot, asks the approver,
then commits the changes and prints the held output (exit status: the
command's), or throws them away and says why (exit status 125). The effect
report the approver judged goes to stderr as a short card (-q: not). It
goes through the resident gate (`caper serve`, started on demand, one per
user and state directory) unless --no-gate or CAPER_NO_GATE=1.

trace prints what the command did, one event a line (strace-like, or JSON
lines), then how it ended; the command's held output goes to caper's own
stdout/stderr afterwards. Exit status: the command's, or 125 when caper
itself failed, 124 on timeout, 137 when the sandbox was killed for a limit.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from caper.version import VERSION

EXIT_CAPER_FAILED = 125
AGENT_NAMES = ["claude-code", "codex", "gemini"]   # caper/front/hooks.py
EXIT_TIMEOUT = 124
EXIT_LIMIT = 137


def _command(args: argparse.Namespace, parser: argparse.ArgumentParser):
    if args.c is not None and args.argv:
        parser.error("give either -c STRING or -- ARGV..., not both")
    if args.c is not None:
        return args.c
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("no command: give -c STRING or -- ARGV...")
    return argv


def _line(ev) -> str:
    d = ev.to_dict()
    head = f"[{d.pop('pid')}] {d.pop('kind')}"
    d.pop("seq")
    d.pop("ppid", None)
    return head + " " + " ".join(f"{k}={json.dumps(v, ensure_ascii=True)}" for k, v in d.items())


def cmd_trace(args, parser) -> int:
    from caper.errors import CaperError
    from caper.sandbox.events import End
    from caper.sandbox.limits import DEFAULT_MAX_MEMORY
    from caper.sandbox.trace import trace

    if args.debug_filter:
        from caper.sandbox._native import lib
        lib.caper_dump_filter(2)
    command = _command(args, parser)
    try:
        t = trace(command, noise=None if args.raw else "baseline",
                  timeout=args.timeout, max_pids=args.max_pids, collapse=not args.raw,
                  max_memory=args.max_memory or DEFAULT_MAX_MEMORY, share_cpu=not args.all_cpus)
        out = sys.stdout
        for ev in t:
            if args.quiet:
                continue
            out.write(json.dumps(ev.to_dict(), ensure_ascii=True) if args.jsonl else _line(ev))
            out.write("\n")
        r = t.result
    except CaperError as e:
        print(f"caper: {e}", file=sys.stderr)
        return EXIT_CAPER_FAILED
    sys.stdout.flush()
    os.write(1, r.stdout.text())
    os.write(2, r.stderr.text())
    summary = {"end": r.end.name.lower(), "exit_code": r.exit_code, "signal": r.signal,
               "stdout_bytes": r.stdout.total, "stderr_bytes": r.stderr.total,
               "stops": r.stats.stops, "events": r.stats.events, "noise": r.stats.noise,
               "collapsed": r.stats.collapsed, "peak_pids": r.stats.peak_pids,
               "wall_ms": round(r.stats.wall_ms, 2)}
    if r.error:
        summary["error"] = r.error
    if not args.quiet:
        if args.jsonl:
            print(json.dumps({"kind": "end", **summary}), flush=True)
        else:
            print("caper: " + r.status + " " + json.dumps(summary), file=sys.stderr)
    if r.end == End.EXITED:
        return r.exit_code
    if r.end == End.SIGNALED:
        return 128 + (r.signal or 0)
    if r.end == End.TIMEOUT:
        return EXIT_TIMEOUT
    if r.end in (End.PIDS_LIMIT, End.MEMORY_LIMIT, End.DISK_LIMIT, End.EVENT_LIMIT):
        return EXIT_LIMIT
    if r.end == End.EXEC_FAILED:
        from caper.display import escape
        print(f"caper: {escape(r.error or '')}", file=sys.stderr)
        return 127
    return EXIT_CAPER_FAILED


def _call_task(args, parser, command, state: str, cwd: str,
               said: "Said") -> tuple[str | None, bool]:
    """The task of a hook's call (--call): from its record, which must name
    this session and exactly this command, for a run in the workspace the
    record's task was given for (the run's, from cwd; else no task, and
    said says why); it serves one run. Also whether it came from the
    transcript (a file the agent can write)."""
    from caper.front.tasks import take_call
    from caper.report.workspace import find_workspace
    if args.task is not None:
        parser.error("--call takes the task from the hook's record: no --task with it")
    if not isinstance(command, str) or not args.session:
        parser.error("--call needs --session and -c STRING, as the hook writes them")
    workspace = os.path.realpath(os.path.join(cwd, args.workspace)) if args.workspace \
        else find_workspace(cwd)
    task, from_transcript, dropped = take_call(state, args.call, args.session, command,
                                               workspace)
    if dropped:
        from caper.display import escape
        said.say(f"caper: note: {escape(dropped)}\n")
    return task, from_transcript


class Said:
    """What a command prints, held until it is done: the CLI writes it to
    its own stdout and stderr, the gate sends it to a native client."""

    def __init__(self) -> None:
        self.out, self.err = bytearray(), bytearray()

    def say(self, text: str, stdout: bool = False) -> None:
        (self.out if stdout else self.err).extend(text.encode("utf-8", "backslashreplace"))

    def emit(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, data in ((1, self.out), (2, self.err)):
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view):]
                except BrokenPipeError:
                    break          # the reader went away: nothing to tell it


def cmd_run(args, parser) -> int:
    said = Said()
    status = _run(args, parser, said)
    said.emit()
    return status


def _request(args, command, task: str | None, from_transcript: bool, caller,
             workspace: str | None, **context):
    """The RunRequest of a parsed `caper run` (context: the cwd and env of a
    caller in another process, the gate's client)."""
    from caper.request import RunRequest
    return RunRequest(command, task=task, task_from_transcript=from_transcript,
                      approver=args.approver, backend=args.backend, timeout=args.timeout,
                      workspace=workspace, session=args.session, on_unsure=args.on_unsure,
                      max_memory=args.max_memory, allow_net=args.allow_net or (),
                      caller=caller, **context)


def _run(args, parser, said: Said) -> int:
    from caper.errors import ConfigError
    from caper.front.tasks import TaskRecordError
    from caper.sandbox.inherit import Caller
    from caper.state import state_dir
    command = _command(args, parser)
    try:
        state = state_dir()
        task, from_transcript = (_call_task(args, parser, command, state, os.getcwd(), said)
                                 if args.call else (args.task, False))
        request = _request(args, command, task, from_transcript,
                           Caller.here(shell=args.shell, stdin=args.stdin), args.workspace)
    except ConfigError as e:
        return _failed(args, str(e), said)
    except (TaskRecordError, ValueError) as e:   # ValueError: a context it cannot get (a tty)
        return _failed(args, f"{e}; not run", said)
    if not args.no_gate and not args.stdin and os.environ.get("CAPER_NO_GATE") != "1":
        from caper.front import gate
        try:
            answer = gate.request(state, request.to_wire())
        except gate.GateUnavailable as e:
            print(f"caper: running in this process ({e})", file=sys.stderr)
        else:
            if "error" in answer:
                status = _failed(args, answer["error"], said)
            else:
                out, err = gate.decode_output(answer)
                status = _finish(args, {**answer["outcome"], "gate": answer["gate_pid"]},
                                 answer["card"], out, err, said)
            # The answer is out and this process holds nothing else: skip the
            # interpreter's teardown, ~4 ms of every hook's `caper run`.
            said.emit()
            os._exit(status)
    from caper.errors import CaperError
    from caper.transaction import run_request
    try:
        outcome = run_request(request, state_dir=state)
    except CaperError as e:
        return _failed(args, f"caper failed: {e}", said)
    return _finish(args, outcome.to_json(), outcome.card(),
                   outcome.stdout.text(), outcome.stderr.text(), said)


def gate_argv(argv: list[str], caller_doc: dict, stdin: bytes, state: str,
              still_wanted, client: int | None = None) -> tuple[int, Said] | str:
    """`caper run ...` or `caper hook ...` made in the gate for the native
    client (csrc/client.c, process client), which sent its argv, its context
    (caller_doc, as Caller.to_json) and, for a hook, its stdin: the exit
    status and what to print. A str: why the gate does not take it (no record
    was used and nothing ran; the client hands it to the Python CLI)."""
    from caper.front.tasks import TaskRecordError
    from caper.sandbox.inherit import DEFAULT_SHELL, Caller
    said = Said()
    if argv[:1] == ["hook"]:
        from caper.front.hooks import AGENTS, hook_text, tell_terminal
        if len(argv) < 2 or argv[1] not in AGENTS:
            return "not an agent caper knows"
        text = hook_text(AGENTS[argv[1]], stdin, env=caller_doc["env"], state=state,
                         client=client)
        if text and argv[1] == "claude-code":
            tell_terminal(text, client)
        said.say(text + "\n" if text else "", stdout=True)
        return 0, said
    if argv[:1] != ["run"]:
        return "only run and hook are made in the gate"
    parser = _run_parser()
    try:   # argparse's errors and --help exit: the CLI prints them
        args = parser.parse_args(argv)
        command = _command(args, parser)
        if args.stdin or args.no_gate:
            return "the caller's stdin (or --no-gate) keeps the run in the caller's process"
        try:
            caller = Caller.from_json({**caller_doc, "shell": args.shell or DEFAULT_SHELL})
        except (KeyError, TypeError, ValueError) as e:
            return f"the client's context is malformed ({e})"
        why = caller.not_reproducible()
        if why:
            return f"{why}: run it in the caller's process"
        if args.call:
            task, from_transcript = _call_task(args, parser, command, state, caller.cwd, said)
        else:
            task, from_transcript = args.task, False
    except SystemExit:
        return "the arguments need the CLI's own messages"
    except TaskRecordError as e:
        return EXIT_CAPER_FAILED, _failed_said(args, f"{e}; not run")
    from caper.errors import CaperError
    from caper.transaction import run_request
    workspace = args.workspace and os.path.join(caller.cwd, args.workspace)
    try:
        out = run_request(_request(args, command, task, from_transcript, caller, workspace,
                                   cwd=caller.cwd, env=caller.env),
                          state_dir=state, still_wanted=still_wanted)
    except CaperError as e:
        return EXIT_CAPER_FAILED, _failed_said(args, f"caper failed: {e}")
    status = _finish(args, {**out.to_json(), "gate": os.getpid()}, out.card(),
                     out.stdout.text(), out.stderr.text(), said)
    return status, said


@functools.cache
def _run_parser() -> argparse.ArgumentParser:
    """The gate's parser for `run`, built once: building it costs more than
    the client's whole exec (parse_args keeps no state in the parser)."""
    return build_parser(only="run")


def _failed_said(args, reason: str) -> Said:
    said = Said()
    _failed(args, reason, said)
    return said


# Codex CLI marks the commands it runs in its own sandbox (workspace-write,
# read-only) this way; there caper finds no writable mount and no gate.
CODEX_SANDBOXED = "CODEX_SANDBOX_NETWORK_DISABLED"


def _failed(args, reason: str, said: Said) -> int:
    from caper.display import escape
    if os.environ.get(CODEX_SANDBOXED) == "1":
        reason += (" (caper is running inside Codex's own sandbox, where it cannot snapshot "
                   "anything: start Codex with --sandbox danger-full-access, or set sandbox_mode "
                   "= \"danger-full-access\" in $CODEX_HOME/config.toml; caper is then the "
                   "sandbox)")
    if args.json:
        said.say(json.dumps({"decision": "block", "reason": reason, "exit_code": None,
                             "committed": False}) + "\n", stdout=True)
    else:
        said.say(f"caper: blocked: {escape(reason)}\n")
    return EXIT_CAPER_FAILED


def _finish(args, doc: dict, card: str | None, stdout: bytes, stderr: bytes, said: Said) -> int:
    """Tell a run's outcome (to said); the exit status: the command's if
    committed, else 125."""
    status = doc["exit_code"] if doc["committed"] and doc["exit_code"] is not None \
        else EXIT_CAPER_FAILED
    if args.json:
        said.say(json.dumps(doc, ensure_ascii=True) + "\n", stdout=True)
        return status
    from caper.display import escape
    if doc["committed"]:         # the command's own output, as it wrote it
        said.out += stdout
        said.err += stderr
    # What caper says, run-derived strings in it included, reaches the
    # terminal escaped: a file name cannot clear the screen or fake a line.
    if not args.quiet and card and not (args.brief and doc["committed"]):
        said.say(escape(card, keep_lines=True))
    for note in doc.get("notes", ()):
        said.say(f"caper: note: {escape(note)}\n")
    if doc.get("held"):
        said.say(f"caper: {escape(doc['reason'])}\n")
    elif not doc["committed"]:
        said.say(f"caper: blocked: {escape(doc['reason'])}\n")
    return status


def cmd_commit(args, parser) -> int:
    from caper import held as pending
    from caper.errors import CaperError
    from caper.state import state_dir
    try:
        state = state_dir(args.state_dir)
        if args.discard:
            pending.discard(state, args.id)
            print(f"caper: held run {args.id} discarded", file=sys.stderr)
            return 0
        if sys.stdin.isatty() and sys.stderr.isatty() and not _confirmed(pending.load(state,
                                                                                  args.id)):
            print(f"caper: held run {args.id} not committed (still held)", file=sys.stderr)
            return EXIT_CAPER_FAILED
        code, out, err = pending.apply(state, args.id)
    except CaperError as e:
        from caper.display import escape
        print(f"caper: not committed: {escape(str(e))}", file=sys.stderr)
        return EXIT_CAPER_FAILED
    os.write(1, out)
    os.write(2, err)
    return code if code is not None else EXIT_CAPER_FAILED


def _confirmed(h) -> bool:
    """A human at a terminal sees what they apply: the held run's card, then
    a question (an agent's shell has no terminal: its host's prompt showed
    the card)."""
    from caper.display import escape
    print(escape(h.card, keep_lines=True), file=sys.stderr)
    print(f"caper: held because: {escape(h.reason)}", file=sys.stderr)
    print(f"caper: commit held run {h.id} into {escape(h.workspace)}? [y/N] ", end="",
          file=sys.stderr, flush=True)
    try:
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    except (OSError, UnicodeDecodeError):
        return False


def cmd_hook(args, parser) -> int:
    from caper.front.hooks import hook_main
    return hook_main(args.agent, timeout_s=args.timeout)


def cmd_install(args, parser) -> int:
    from caper.front import hooks
    scope = "user" if args.user else "project" if args.project else None
    try:
        if args.remove:
            print(f"caper: removed from {hooks.uninstall(args.agent, scope)}")
            return 0
        path, todo = hooks.install(args.agent, scope, timeout_s=args.hook_timeout)
    except (OSError, ValueError) as e:
        print(f"caper: {e}", file=sys.stderr)
        return 1
    print(f"caper: installed in {path}")
    for line in todo:
        print(f"caper: WARNING: {line}", file=sys.stderr)
    from caper.front import doctor     # the rest of what caper needs, each with its fix
    print("caper doctor:\n" + doctor.report(doctor.run(agents=[args.agent]))[0])
    return 1 if todo else 0


def cmd_doctor(args, parser) -> int:
    from caper.front import doctor
    text, status = doctor.report(doctor.run(args.cwd, agents=args.agent,
                                            sandbox=not args.no_sandbox))
    print(text)
    return status


def cmd_mcp(args, parser) -> int:
    from caper.front.mcp_server import main
    return main()


def cmd_serve(args, parser) -> int:
    from caper.errors import ConfigError
    from caper.front.gate import IDLE_S, serve
    from caper.state import state_dir
    try:
        state = state_dir(args.state_dir)
    except ConfigError as e:
        print(f"caper serve: {e}", file=sys.stderr)
        return 1
    return serve(state, gate_argv, args.idle or IDLE_S)


def cmd_session(args, parser) -> int:
    from caper.errors import CaperError
    from caper.judge.session import open_sessions
    from caper.request import check_session_id
    from caper.state import state_dir

    try:
        with open_sessions(state_dir(args.state_dir)) as sessions:
            if args.action == "reset":
                if not args.id:
                    parser.error("caper session reset ID")
                sessions.reset(check_session_id(args.id))
                print(f"caper: session {args.id} re-opened")
                return 0
            from caper.display import escape
            for sid, n, blocks, why in sessions.sessions():
                state = "STOPPED" if why else "open"
                print(f"{escape(sid)}\t{n} reviews\t{blocks} blocked\t{state}")
    except CaperError as e:
        print(f"caper: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args, parser) -> int:
    from caper.front.demo import main as demo
    from caper.errors import CaperError
    try:
        return demo()
    except CaperError as e:
        print(f"caper demo: caper failed: {e}", file=sys.stderr)
        return EXIT_CAPER_FAILED


def cmd_recover(args, parser) -> int:
    from caper.errors import CaperError
    from caper.state import state_dir
    from caper.upkeep import tidy

    try:
        state = state_dir(args.state_dir)
        done = tidy(state)
    except CaperError as e:
        print(f"caper: recover failed: {e}", file=sys.stderr)
        return 1
    from caper.display import escape
    for line in done:
        print(escape(line))
    if not done:
        print("caper: nothing to recover", file=sys.stderr)
    # "<id>: FAILED, ... kept": that commit's paths stay as they are (later
    # runs that touch them are refused); the caller must know.
    failed = [line for line in done if line.partition(": ")[2].startswith("FAILED")]
    if failed:
        print(f"caper: {len(failed)} interrupted commit(s) could not be recovered", file=sys.stderr)
        return 1
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse asks shutil for the terminal's width, and importing shutil
    costs every `caper run` through the gate ~3 ms: ask os directly."""

    def _get_formatter(self):
        return self.formatter_class(prog=self.prog, width=_columns())


def _columns() -> int:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80


def _args_run(r: argparse.ArgumentParser) -> None:
    # The options' names and defaults are caper.request's; an option left
    # out is None, which RunRequest reads as its default.
    from caper.request import APPROVERS, BACKENDS, ON_UNSURE
    r.add_argument("-c", metavar="STRING", help="run STRING with SHELL -c (see --shell)")
    r.add_argument("--shell", metavar="SHELL",
                   help="the shell that runs -c STRING (default /bin/sh, as sh -c and "
                        "system(3); the agents' hooks give bash, their tools' shell)")
    r.add_argument("--task", help="what the user asked for (evidence for the approver): "
                                  "your own words, when you call caper yourself")
    r.add_argument("--call", metavar="ID",
                   help="a hook's call record: the task is the one the hook recorded for this "
                        "session and exactly this command (caper.front.tasks)")
    r.add_argument("--approver", choices=APPROVERS,
                   help="auto (default): policy, then the LLM if configured for what policy is "
                        "unsure of; allow: commit everything; block: preview only")
    r.add_argument("--session", metavar="ID",
                   help="the agent session (history, circuit breaker)")
    r.add_argument("--on-unsure", choices=ON_UNSURE,
                   help="when the approver is unsure (default: config.toml's, else block); "
                        "ask: hold the run for a human (`caper commit ID` applies it)")
    r.add_argument("--backend", choices=BACKENDS,
                   help="auto: btrfs where the workspace is a btrfs subvolume (as root), "
                        "else overlay")
    _args_limits(r, "config.toml's [limits] max_memory, else ")
    r.add_argument("--workspace", metavar="DIR",
                   help="the project (default: git top level of the cwd, else the cwd)")
    r.add_argument("--allow-net", action="append", metavar="HOST[:PORT]",
                   help="let the command reach this host through caper's recording proxy, "
                        "or by its name (caper's DNS and route) for tools that ignore proxy "
                        "variables (repeatable; *.DOMAIN for subdomains; presets: pypi, npm, crates, "
                        "goproxy, github); besides config.toml's [network] allow. Default: "
                        "no network")
    r.add_argument("--json", action="store_true",
                   help="one JSON object on stdout (with the effect report)")
    r.add_argument("-q", "--quiet", action="store_true",
                   help="no effect report card on stderr")
    r.add_argument("--brief", action="store_true",
                   help="the card only when the run is not committed (what an agent's hook asks "
                        "for: an approved command's output is just its own)")
    r.add_argument("--stdin", action="store_true",
                   help="give the command caper's stdin (default: /dev/null); runs in this "
                        "process, not through the gate")
    r.add_argument("--no-gate", action="store_true",
                   help="run in this process, not through the resident gate (CAPER_NO_GATE=1)")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    r.set_defaults(func=cmd_run)


def _args_session(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=["list", "reset"])
    s.add_argument("id", nargs="?")
    _state_dir(s)
    s.set_defaults(func=cmd_session)


def _args_held(c: argparse.ArgumentParser, discard: bool) -> None:
    c.add_argument("id")
    _state_dir(c)
    c.set_defaults(func=cmd_commit, discard=discard)


def _args_hook(h: argparse.ArgumentParser) -> None:
    h.add_argument("agent", choices=AGENT_NAMES)
    h.add_argument("--timeout", type=float, metavar="S",
                   help="the hook's timeout in the agent's settings: it answers deny at half")
    h.set_defaults(func=cmd_hook)


def _args_install(ins: argparse.ArgumentParser, remove: bool) -> None:
    ins.add_argument("agent", choices=AGENT_NAMES)
    where = ins.add_mutually_exclusive_group()
    where.add_argument("--project", action="store_true",
                       help="the project's settings (.claude/settings.json, "
                            ".codex/hooks.json, .gemini/settings.json): Claude Code's default")
    where.add_argument("--user", action="store_true",
                       help="the user's (~/.claude, $CODEX_HOME, ~/.gemini): the default for "
                            "Codex and Gemini, which can skip project hooks")
    ins.add_argument("--hook-timeout", type=float, metavar="S",
                     help="the hook's timeout (default 30 s); it answers deny at half")
    ins.set_defaults(func=cmd_install, remove=remove)


def _args_doctor(d: argparse.ArgumentParser) -> None:
    d.add_argument("--cwd", metavar="DIR", help="the project to check the agents' settings for")
    d.add_argument("--agent", action="append", choices=AGENT_NAMES,
                   help="check only this agent (repeatable; default: all three)")
    d.add_argument("--no-sandbox", action="store_true", help="skip the sandboxed `true` run")
    d.set_defaults(func=cmd_doctor)


def _args_serve(sv: argparse.ArgumentParser) -> None:
    _state_dir(sv)
    sv.add_argument("--idle", type=float, metavar="S", help="exit after S idle seconds (900)")
    sv.set_defaults(func=cmd_serve)


def _args_recover(rc: argparse.ArgumentParser) -> None:
    _state_dir(rc)
    rc.set_defaults(func=cmd_recover)


def _args_trace(t: argparse.ArgumentParser) -> None:
    t.add_argument("-c", metavar="STRING", help="run STRING with /bin/sh -c")
    t.add_argument("--jsonl", action="store_true", help="one JSON object per event")
    t.add_argument("--quiet", action="store_true", help="print no events, only the output")
    t.add_argument("--raw", action="store_true",
                   help="keep baseline noise and repeated events (no pre-filter)")
    _args_limits(t)
    t.add_argument("--max-pids", type=int, default=1024, metavar="N")
    t.add_argument("--all-cpus", action="store_true",
                   help="let the sandbox use every CPU (parallel builds); by default it shares "
                        "one CPU with the tracer, which makes each ptrace stop ~3x cheaper")
    t.add_argument("--debug-filter", action="store_true",
                   help="print the seccomp program as pseudocode first")
    t.add_argument("argv", nargs=argparse.REMAINDER)
    t.set_defaults(func=cmd_trace)


def _args_limits(p: argparse.ArgumentParser, memory_default: str = "") -> None:
    """The sandbox's limits, as `caper run` and `caper trace` take them."""
    from caper.request import DEFAULT_TIMEOUT_S
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"the command's time limit (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--max-memory", type=_size, metavar="SIZE",
                   help=f"memory of the whole sandbox, e.g. 4G (default: {memory_default}"
                        "half of RAM, at most 8 GiB)")


def _size(text: str) -> int:
    from caper.sandbox.limits import parse_size
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="caper's state directory (default: as caper run)")


# name -> (help, adds its arguments)
SUBCOMMANDS = {
    "run": ("run a command in a snapshot; commit it if approved", _args_run),
    "session": ("list sessions, or re-open one's stopped gate", _args_session),
    "commit": ("commit a run held for a human", lambda c: _args_held(c, False)),
    "discard": ("discard a run held for a human", lambda c: _args_held(c, True)),
    "hook": ("an agent's hook: reads its JSON on stdin", _args_hook),
    "install": ("install caper's hook in an agent's settings", lambda i: _args_install(i, False)),
    "uninstall": ("uninstall caper's hook in an agent's settings", lambda i: _args_install(i, True)),
    "doctor": ("is caper really in front of each agent? (hooks, trust, gate, kernel)",
               _args_doctor),
    "mcp": ("an MCP server (stdio) with a run_command tool",
            lambda m: m.set_defaults(func=cmd_mcp)),
    "serve": ("the resident gate `caper run` talks to (started on demand)", _args_serve),
    "demo": ("the paper's example, end to end, with the offline approver",
             lambda d: d.set_defaults(func=cmd_demo)),
    "recover": ("finish or undo interrupted commits; remove what killed runs left", _args_recover),
    "trace": ("run a command in the sandbox and print what it did", _args_trace),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """only: the subcommand being run. The others are listed (for -h and
    errors) without their arguments: argparse takes ~3 ms to build them all,
    at every `caper run` a hook makes."""
    p = _Parser(prog="caper", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"caper {VERSION}")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, (text, add_arguments) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=text)
        if only not in SUBCOMMANDS or only == name:
            add_arguments(sp)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    return args.func(args, parser)
