"""``rethook record|stream|profile PROGRAM`` without click: the command line's most common uses,
started ~1/3 sooner.

Importing click (and the ``inspect``, ``typing``, ``gettext`` and ``difflib`` it loads) takes
about as long as the rest of a recording's start. :func:`parse` reads the flags of
:mod:`rethook.cli.options`' table, the same table the commands' click options are made from,
and takes only what it is sure of: the command's trace flags (:data:`FLAGS`), ``-m`` and the
program. Anything else (``-h``, ``-P``, the probe events' ``-e``/``-f``/``-R``, a flag it does
not know, a missing value, a value that does not convert, shell completion) makes it return
None, and click parses the whole command line as before: every help text and every parse
error stays click's. tests/test_quick.py checks that whatever it takes, click reads the same.
A usage error met later (no such script, a filter matching nothing) is shown by click's
``UsageError`` with record's context, as the click command shows it.
"""

from __future__ import annotations

import os
import sys

from rethook.cli import options, running
from rethook.cli.options import (
    BLOCKING,
    MANY,
    MODULE,
    OUTPUT,
    PROFILE_FLAGS,
    SWITCH,
    TRACE_FLAGS,
    split_program_args,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from rethook.cli.options import Flag

#: The flags this parser reads for each command (besides -m): record's and stream's trace
#: flags (record's -o and --blocking-timeout too), profile's filters and -O. profile's own
#: (-o, --sort, --limit, --per-process) are click's.
FLAGS: dict[str, tuple[Flag, ...]] = {"record": (*TRACE_FLAGS, OUTPUT, BLOCKING),
                                      "stream": TRACE_FLAGS, "profile": PROFILE_FLAGS}
#: click's shell completion runs when this is set: its own business.
COMPLETE_VAR = "_RETHOOK_COMPLETE"


def parse(command: str, args: list[str]
          ) -> tuple[dict[str, Any], str | None, tuple[str, ...]] | None:
    """The arguments after ``rethook COMMAND`` as (parameters by name, -m's module, the
    program and its arguments), or None if click must read them."""
    flags = FLAGS[command]
    by_name = {decl: flag for flag in (*flags, MODULE) for decl in flag.decls}
    takes_value = {decl for flag in (*flags, MODULE) if flag.takes != SWITCH
                   for decl in flag.decls}
    own, program = split_program_args(list(args), takes_value)
    params: dict[str, Any] = {flag.dest: flag.default for flag in flags}
    many: dict[str, list[Any]] = {}
    i = 0
    while i < len(own):
        arg = own[i]
        i += 1
        if arg.startswith("--"):  # --name or --name=value
            name, eq, value = arg.partition("=")
            attached = bool(eq)
        else:  # -x or -xVALUE (split_program_args leaves no positional argument here)
            name, value = arg[:2], arg[2:]
            attached = bool(value)
        flag: Flag | None = by_name.get(name)
        if flag is None:
            return None
        if flag.takes == SWITCH:
            if attached:
                return None
            params[flag.dest] = flag.flag_value
            continue
        if not attached:
            if i == len(own):
                return None
            value = own[i]
            i += 1
        try:
            converted = flag.convert(value)
        except ValueError:
            return None
        if flag.takes == MANY:
            many.setdefault(flag.dest, []).append(converted)
        else:
            params[flag.dest] = converted
    params.update((dest, tuple(values)) for dest, values in many.items())
    module = params.pop(MODULE.dest, None)
    return params, module, tuple(program)


def run(argv: list[str]) -> None:
    """Run ``rethook ARGV`` if it is a command this parser can read (it then exits as the
    program did); return if click must."""
    if not argv or argv[0] not in FLAGS or os.environ.get(COMPLETE_VAR):
        return
    command = argv[0]
    parsed = parse(command, argv[1:])
    if parsed is None:
        return
    params, module, program = parsed
    try:
        if command == "record":
            output = params.pop(OUTPUT.dest)
            running.record_program(module, program, lambda: options.settings_from(params),
                                   output)
        elif command == "stream":
            running.stream_program(module, program, lambda: options.settings_from(params))
        else:
            running.profile_program(module, program,
                                    lambda: options.settings_from(params, tracer="nop"),
                                    running.ProfileShow())
    except running.Usage as e:
        _usage_error(command, str(e))
    except (EOFError, KeyboardInterrupt):  # rethook's own set-up or finish: as click ends it
        running.stderr("\nAborted!")
        sys.exit(1)


def _usage_error(command: str, message: str) -> NoReturn:
    """Show ``message`` as click shows a usage error of ``rethook COMMAND`` (status 2)."""
    import click

    from rethook.cli.main import cli

    cmd = cli.commands[command]
    parent = click.Context(cli, info_name="rethook", **cli.context_settings)
    ctx = click.Context(cmd, info_name=command, parent=parent, **cmd.context_settings)
    error = click.UsageError(message, ctx)
    error.show()
    sys.exit(error.exit_code)
