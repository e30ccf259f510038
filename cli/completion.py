"""``headroom completion bash|zsh|fish``: a shell completion script, written from the parser itself.

Every command and subcommand, every option of each, and the values of an option with a closed set of them
(``--precision``, ``--stack``, ``--interconnect``, ...) complete; other values complete as file names (a
config.json, a bundle, a store), ``--model`` as a preset too. The script is generated from the same parser that reads the arguments, so
it cannot fall behind the commands. zsh runs the bash script through ``bashcompinit``.

    eval "$(headroom completion bash)"        # in ~/.bashrc
    eval "$(headroom completion zsh)"         # in ~/.zshrc
    headroom completion fish | source         # in ~/.config/fish/config.fish
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

SHELLS = ("bash", "zsh", "fish")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "completion", help="print a shell completion script (bash, zsh, fish)",
        description="Print a completion script for SHELL: commands, options and the values of options that take "
        'one of a list. Example: eval "$(headroom completion bash)" in ~/.bashrc; eval "$(headroom completion '
        'zsh)" in ~/.zshrc; headroom completion fish | source in ~/.config/fish/config.fish',
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headroom.cli.main import build_parser

    commands = leaf_commands(build_parser())
    print({"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[args.shell](commands))
    return 0


@dataclass(frozen=True, slots=True)
class Option:
    flags: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...] = ()
    """The only values it takes; empty: any (completed as a file name, and as ``suggested``)."""
    suggested: tuple[str, ...] = ()
    """Values offered besides file names: a model's presets."""


def _suggested(flags: tuple[str, ...]) -> tuple[str, ...]:
    """Values to offer for an option that also takes others: the presets for ``--model`` (or a file), the named
    networks for ``--interconnect`` (or NICs x Gb/s)."""
    from headroom.core.specs.interconnect import LINKS_BY_KEY
    from headroom.core.specs.presets import PRESETS

    if "--model" in flags:
        return tuple(PRESETS)
    return tuple(LINKS_BY_KEY) if "--interconnect" in flags else ()


@dataclass(frozen=True, slots=True)
class Command:
    words: tuple[str, ...]
    """The command's words after ``headroom``: ("plan",), ("db", "import")."""
    options: tuple[Option, ...]
    subcommands: tuple[str, ...] = ()
    """Words that may follow (a command with actions, such as db); empty for a leaf."""
    positional: tuple[str, ...] = ()
    """The values a positional argument takes, where they are a closed set (the shell of ``completion``)."""


def leaf_commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[Command]:
    """Every command of ``parser`` with its options, depth first: a command with subcommands, then each of
    them."""
    options, found, positional = [], [], ()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            names = tuple(action.choices)
            found.append(Command(words, (), names))
            for name, sub in action.choices.items():
                found += leaf_commands(sub, (*words, name))
        elif action.option_strings:
            choices = tuple(str(c) for c in action.choices) if action.choices else ()
            flags = tuple(action.option_strings)
            options.append(Option(flags, action.nargs != 0, choices, _suggested(flags)))
        elif action.choices:
            positional = tuple(str(c) for c in action.choices)
    if not found:
        return [Command(words, tuple(options), positional=positional)]
    return found


def bash_script(commands: list[Command]) -> str:
    """A ``complete -F`` function: the words typed pick the command, the previous word an option's values."""
    cases, values = [], []
    for command in commands:
        key = " ".join(command.words)
        words = " ".join(command.subcommands) if command.subcommands else \
            " ".join(flag for option in command.options for flag in option.flags)
        cases.append(f"        {shlex.quote(key)}) words={shlex.quote(words)} "
                     f"values={shlex.quote(' '.join(command.subcommands or command.positional))} ;;")
        for option in command.options:
            if option.choices:
                for flag in option.flags:
                    values.append(f"        {shlex.quote(key + ' ' + flag)}) "
                                  f"COMPREPLY=($(compgen -W {shlex.quote(' '.join(option.choices))} -- \"$cur\")); return ;;")
            elif option.takes_value:
                for flag in option.flags:
                    offered = f"$(compgen -W {shlex.quote(' '.join(option.suggested))} -- \"$cur\") " \
                        if option.suggested else ""
                    values.append(f"        {shlex.quote(key + ' ' + flag)}) "
                                  f"COMPREPLY=({offered}$(compgen -f -- \"$cur\")); return ;;")
    nested = " ".join(" ".join(c.words) for c in commands if c.subcommands and c.words)
    return "\n".join([
        "# headroom completion bash: eval \"$(headroom completion bash)\"",
        "_headroom() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" key="" words="" values="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do  # the command: the words typed before any option",
        '        [[ ${COMP_WORDS[i]} == -* ]] && break',
        '        key="${key:+$key }${COMP_WORDS[i]}"',
        f"        [[ \" {nested} \" == *\" $key \"* ]] || break",
        "    done",
        '    case "$key $prev" in',
        *values,
        "    esac",
        '    case "$key" in',
        *cases,
        "    esac",
        '    if [[ $cur == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))  # an option',
        '    elif [[ -n $values ]]; then',
        '        COMPREPLY=($(compgen -W "$values" -- "$cur"))  # a subcommand, or a positional of a closed set',
        "    else",
        '        COMPREPLY=($(compgen -f -- "$cur"))  # a path (a bundle, a store, a config.json)',
        "    fi",
        "}",
        "complete -o filenames -F _headroom headroom",
    ])


def zsh_script(commands: list[Command]) -> str:
    """The bash function, through zsh's bashcompinit."""
    return "\n".join(["# headroom completion zsh: eval \"$(headroom completion zsh)\"",
                      "autoload -U +X compinit && compinit", "autoload -U +X bashcompinit && bashcompinit",
                      bash_script(commands).split("\n", 1)[1]])


def fish_script(commands: list[Command]) -> str:
    """``complete -c headroom`` lines, each under the condition that its command's words were typed."""
    lines = ["# headroom completion fish: headroom completion fish | source", "complete -c headroom -f"]
    for command in commands:
        seen = " ".join(f"; and __fish_seen_subcommand_from {word}" for word in command.words)
        if command.subcommands:
            condition = "__fish_use_subcommand" if not command.words else \
                f"true{seen}; and not __fish_seen_subcommand_from {' '.join(command.subcommands)}"
            lines.append(f"complete -c headroom -n {shlex.quote(condition)} -a {shlex.quote(' '.join(command.subcommands))}")
            continue
        condition = f"true{seen}"
        if command.positional:
            lines.append(f"complete -c headroom -n {shlex.quote(condition)} -x -a "
                         f"{shlex.quote(' '.join(command.positional))}")
        for option in command.options:
            longs = [flag.removeprefix("--") for flag in option.flags if flag.startswith("--")]
            shorts = [flag.removeprefix("-") for flag in option.flags if not flag.startswith("--")]
            names = " ".join([*(f"-l {name}" for name in longs), *(f"-s {name}" for name in shorts)])
            values = f" -x -a {shlex.quote(' '.join(option.choices))}" if option.choices else \
                f" -r -F -a {shlex.quote(' '.join(option.suggested))}" if option.suggested else \
                " -r -F" if option.takes_value else ""
            lines.append(f"complete -c headroom -n {shlex.quote(condition)} {names}{values}")
    return "\n".join(lines)
