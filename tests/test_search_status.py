"""The status line a layout search draws on a terminal: when, what it says, and that it leaves no trace."""

import io

from headroom.cli.search_status import ERASE, SearchStatus


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_says_how_far_the_search_is_and_what_is_left_at_its_pace():
    screen, clock = Terminal(), Clock()
    status = SearchStatus(screen, after_s=1.0, every_s=0.2, clock=clock)
    clock.now = 100.5
    status(1, 10, "layouts of 64 GPUs")  # under a second in: a quick plan prints nothing
    assert screen.getvalue() == ""
    clock.now = 102.0
    status(4, 10, "layouts of 64 GPUs")  # 4 layouts in 2 s: 6 left, 3 s
    assert screen.getvalue() == f"{ERASE}searching layouts of 64 GPUs: 4/10, about 3s left"
    clock.now = 102.1
    status(5, 10, "layouts of 64 GPUs")  # drawn 0.1 s ago: not redrawn
    assert screen.getvalue().count(ERASE) == 1
    status.close()
    assert screen.getvalue().endswith(f"left{ERASE}")


def test_each_search_of_the_advice_is_paced_from_its_own_first_layout():
    screen, clock = Terminal(), Clock()
    status = SearchStatus(screen, after_s=0.0, every_s=0.0, clock=clock)
    clock.now = 200.0
    status(1, 3, "layouts of 8 GPUs, for advice: --gpus 8")  # a new search: no pace yet
    clock.now = 290.0
    status(2, 3, "layouts of 8 GPUs, for advice: --gpus 8")  # 190 s for two layouts: 1 left
    clock.now = 300.0
    status(1, 2000, "layouts of 16 GPUs, for advice: --gpus 16")
    assert screen.getvalue().split(ERASE)[1:] == [
        "searching layouts of 8 GPUs, for advice: --gpus 8: 1/3, about 3m20s left",  # paced from the command's start
        "searching layouts of 8 GPUs, for advice: --gpus 8: 2/3, about 1m35s left",
        "searching layouts of 16 GPUs, for advice: --gpus 16: 1/2,000",
    ]


def test_nothing_is_written_where_stderr_is_not_a_terminal_nor_erased_when_nothing_was_drawn():
    log, clock = io.StringIO(), Clock()
    status = SearchStatus(log, after_s=0.0, every_s=0.0, clock=clock)
    clock.now = 500.0
    status(1, 2, "layouts of 8 GPUs")
    status.close()
    assert log.getvalue() == ""
    screen = Terminal()
    SearchStatus(screen, clock=clock).close()
    assert screen.getvalue() == ""


def test_a_plan_on_a_terminal_draws_its_search_and_erases_it(monkeypatch, capsys):
    """`headroom plan --gpus 8` with stderr on a terminal: the search is drawn, then erased before the plan."""
    import functools

    import headroom.cli.plan
    from headroom.cli.main import main

    screen = Terminal()
    monkeypatch.setattr(headroom.cli.plan, "SearchStatus", functools.partial(SearchStatus, screen, after_s=0.0, every_s=0.0))
    main(["plan", "--model", "bench-llama-small", "--seq-len", "128", "--global-batch", "8", "--gpus", "8"])
    lines = screen.getvalue().split(ERASE)
    assert lines[0] == lines[-1] == ""  # each line erased the last, and the last was erased
    assert lines[1:-1] and all(line.startswith("searching layouts of 8 GPUs: ") for line in lines[1:-1])
    assert lines[-2].startswith("searching layouts of 8 GPUs: 87/87")
    assert capsys.readouterr().out.startswith("plan: bench-llama-small")
