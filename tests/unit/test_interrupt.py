"""A Ctrl-C that lands where it is swallowed (a callback Ray runs from C) still stops the job."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlsched.job.interrupt import CtrlC


def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_check_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGINT)
    ctrl_c = CtrlC()
    with ctrl_c:
        ctrl_c.check()  # nothing pressed: nothing raised
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
        except KeyboardInterrupt:
            pass  # swallowed where it landed
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.check()
    assert signal.getsignal(signal.SIGINT) is before
