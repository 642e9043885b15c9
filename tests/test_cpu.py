"""Torch threads that follow the cores other processes leave free (`tirl.cpu`; the contention
it answers is measured by bench/threads.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from tirl.cpu import (
    ThreadGovernor,
    busy_cpu_seconds,
    others_busy_cores,
    threads_for,
    usable_cores,
)


def test_threads_are_the_free_cores_rounded_between_one_and_the_usable_ones():
    assert threads_for(0.0, 4) == 4
    assert threads_for(0.6, 4) == 3  # 3.4 free
    assert threads_for(1.5, 4) == 2  # 2.5 free: round half to even
    assert threads_for(3.9, 4) == 1
    assert threads_for(7.0, 4) == 1  # never none


def test_others_load_is_all_busy_time_less_this_process_own():
    # 2 s: the CPUs were busy 3.0 s in all, 1.9 s of it this process -> others held 0.55 cores
    assert others_busy_cores((10.0, 100.0, 40.0), (12.0, 103.0, 41.9)) == pytest.approx(0.55)
    # a neighbour that left: all the busy time was this process's own (clock-tick rounding
    # can make it look larger than the total: never below zero)
    assert others_busy_cores((0.0, 50.0, 20.0), (1.0, 51.9, 21.95)) == 0.0


def test_a_fixed_count_is_set_on_every_thread_that_paces():
    before = torch.get_num_threads()
    governor = ThreadGovernor(fixed=1)
    seen = []

    def work():
        governor.pace()
        seen.append(torch.get_num_threads())

    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        assert governor.pace() == 1 and torch.get_num_threads() == 1
        assert seen == [1]  # OpenMP's count is per thread: the worker set its own
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(busy_cpu_seconds() is None, reason="no /proc/stat: load cannot be measured")
def test_busy_neighbours_take_the_threads_they_hold():
    if usable_cores() < 2:
        pytest.skip("one usable core: there is no thread to give up")
    before = torch.get_num_threads()
    governor = ThreadGovernor(interval_s=0.5)
    assert governor.pace() == usable_cores()  # before any window: every core
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(usable_cores() - 1)
    ]
    try:
        time.sleep(governor.interval_s + 0.3)
        assert governor.pace() == 1  # all cores but one held by others
        assert torch.get_num_threads() == 1
    finally:
        for spin in spinners:
            spin.kill()
            spin.wait()
        torch.set_num_threads(before)


def test_threads_computing_at_once_share_the_governed_count():
    import tirl.cpu as cpu

    before = torch.get_num_threads()
    try:
        cpu.configure_threads(2)
        with cpu.sharing_cores(2):  # a sampler and a one-step-off-policy update
            assert cpu._governor.pace() == 1 and torch.get_num_threads() == 1
        assert cpu._governor.pace() == 2  # alone again: the whole count
        with cpu.sharing_cores(4):
            assert cpu._governor.pace() == 1  # never none
    finally:
        cpu._governor = None
        torch.set_num_threads(before)


def test_a_cap_bounds_the_threads_on_the_thread_that_paces_it():
    import tirl.cpu as cpu

    before = torch.get_num_threads()
    try:
        cpu.configure_threads(2)
        assert cpu._governor.pace(at_most=1) == 1 and torch.get_num_threads() == 1
        assert cpu._governor.pace(at_most=4) == 2  # a cap above the choice changes nothing
        assert cpu._governor.pace() == 2
        cpu._governor = None  # ungoverned (tirl as a library): the cap is on torch's own count
        torch.set_num_threads(2)
        cpu.pace(1)
        assert torch.get_num_threads() == 1
        cpu.pace(3)
        assert torch.get_num_threads() == 1  # a cap never raises the count
    finally:
        cpu._governor = None
        torch.set_num_threads(before)
