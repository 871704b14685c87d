#!/usr/bin/python3
"""Tests of the in-process chaos judge (chaos_inprocess_checks.py) on synthetic worker logs:
each invariant is caught when broken and stays quiet when kept. Standard library only; run by
CTest ("chaos in-process checks: ...")."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_inprocess_checks import AgentExit, Kill, check  # noqa: E402
from time_lost_job import Line  # noqa: E402

T0 = 1_000_000.0
WORLD = 2
BOUND = 20.0


class Log:
    """A synthetic time_lost_train.py log: processes start, enter and commit steps."""

    def __init__(self):
        self.lines = []

    def add(self, *words):
        self.lines.append(Line([str(w) for w in words]))

    def start(self, t, rank, pid, restart=0, generation="-"):
        self.add("START", rank, pid, T0 + t, restart, generation)
        self.add("ENTER", rank, pid, T0 + t + 0.01, 0, "-")

    def enter(self, t, rank, pid, step):
        self.add("ENTER", rank, pid, T0 + t, step, "-")

    def steps(self, t, rank, pid, first, last, sha=lambda s: f"h{s}"):
        """Steps first..last of one process, 50 ms apart from t; sha(step): its checksum."""
        for i, s in enumerate(range(first, last + 1)):
            self.add("STEP", rank, s, T0 + t + 0.05 * i, pid, sha(s))

    def end(self, t, rank, pid, step, sha=None):
        self.add("END", rank, step, T0 + t, pid, sha or f"h{step}")


def first_round(last):
    """Ranks 0 and 1 (pids 10, 11) start at 0 and commit steps 1..last from 0.5 s on."""
    log = Log()
    log.start(0.0, 0, 10)
    log.start(0.0, 1, 11)
    log.steps(0.5, 0, 10, 1, last)
    log.steps(0.5, 1, 11, 1, last)
    return log


def agents(code=0, output=""):
    return [AgentExit("0", code, False, output), AgentExit("1", code, False, output)]


def kinds(summary):
    return sorted({v.kind for v in summary.violations})


def run(log, kills, agent_list=None, job_end=T0 + 10):
    return check(log.lines, kills, agent_list or agents(), WORLD, 3, BOUND, job_end, T0)


def formed_recovery():
    """Rank 1 (pid 11) killed at 1.0 after step 10; its replacement (pid 12) and the survivor
    (pid 10, re-entered) go on from step 11 to 20."""
    log = first_round(10)
    log.enter(2.0, 0, 10, 10)
    log.start(1.5, 1, 12, restart=1)
    log.enter(2.0, 1, 12, 10)
    log.steps(2.1, 0, 10, 11, 20)
    log.steps(2.1, 1, 12, 11, 20)
    log.end(3.2, 0, 10, 20)
    log.end(3.2, 1, 12, 20)
    return log, [Kill(T0 + 1.0, "worker_kill", "rank 1 pid 11", (1,))]


class InProcessChecksTest(unittest.TestCase):
    def test_a_formed_recovery_is_clean(self):
        log, kills = formed_recovery()
        s = run(log, kills)
        self.assertEqual(kinds(s), [])
        self.assertEqual(s.recoveries, ["formed"])
        self.assertTrue(s.ended)

    def test_a_survivor_committing_on_old_state_is_two_generations(self):
        _, kills = formed_recovery()
        log = first_round(10)
        log.start(1.5, 1, 12, restart=1)
        log.enter(2.0, 1, 12, 10)
        log.steps(2.1, 1, 12, 11, 12)
        log.steps(2.2, 0, 10, 11, 12)   # pid 10 never re-entered: stale generation
        s = run(log, kills, job_end=None)
        self.assertIn("two generations at once", kinds(s))

    def test_different_parameters_at_one_step_are_caught(self):
        log, kills = formed_recovery()
        log.steps(2.1, 1, 12, 11, 20, sha=lambda s: "stale" if s == 11 else f"h{s}")
        s = run(log, kills)
        self.assertEqual(kinds(s), ["parameters differ across ranks"])

    def test_a_redone_step_counts_by_its_last_commit(self):
        log, kills = formed_recovery()
        # Before the kill rank 1 committed step 10 with other parameters, then the job redid it.
        log.add("STEP", 1, 10, T0 + 0.2, 11, "old")
        s = run(log, kills)
        self.assertNotIn("parameters differ across ranks", kinds(s))

    def test_a_recovery_that_never_resolves_is_stuck(self):
        log = first_round(10)
        s = run(log, [Kill(T0 + 1.0, "worker_kill", "rank 1", (1,))], agents(None), job_end=None)
        self.assertEqual(kinds(s), ["recovery stuck"])

    def test_a_job_that_ends_within_the_bound_is_not_stuck(self):
        log = first_round(10)
        s = run(log, [Kill(T0 + 1.0, "worker_kill", "rank 1", (1,))], agents(1), T0 + 5)
        self.assertEqual(kinds(s), [])
        self.assertEqual(s.recoveries, ["ended"])

    def restarted(self, output):
        log = first_round(10)
        log.start(3.0, 0, 20, restart=1)
        log.start(3.0, 1, 21, restart=1)
        log.steps(3.5, 0, 20, 1, 5)
        log.steps(3.5, 1, 21, 1, 5)
        log.end(4.0, 0, 20, 5)
        log.end(4.0, 1, 21, 5)
        return run(log, [Kill(T0 + 1.0, "worker_kill", "rank 1", (1,))], agents(0, output))

    def test_a_restart_must_say_why_the_recovery_fell_back(self):
        s = self.restarted("drun: rank 1 failed\n")
        self.assertEqual(kinds(s), ["restart without a reason"])
        s = self.restarted("drun: generation 1 did not form: rank 1 never joined; restarting "
                           "the job\n")
        self.assertEqual(kinds(s), [])
        self.assertEqual(s.recoveries, ["restart"])

    def test_restart_counts_never_go_back_nor_past_the_budget(self):
        log, kills = formed_recovery()
        log.start(2.5, 0, 30, restart=0)
        self.assertIn("restart count", kinds(run(log, kills)))
        log, kills = formed_recovery()
        log.start(2.5, 0, 30, restart=4)
        self.assertIn("restart count", kinds(run(log, kills)))

    def test_a_second_death_during_a_recovery_is_a_replacement_not_a_restart(self):
        # Ranks 0-2; rank 1 killed at 1.0, rank 2 at 1.2 during its recovery; both replaced
        # (pids 21, 22), rank 0 kept: both recoveries formed.
        log = Log()
        for rank in range(3):
            log.start(0.0, rank, 10 + rank)
            log.steps(0.5, rank, 10 + rank, 1, 10)
        log.start(1.5, 1, 21, restart=1, generation=1)
        log.start(1.6, 2, 22, restart=2, generation=2)
        for rank, pid in ((0, 10), (1, 21), (2, 22)):
            log.enter(2.0, rank, pid, 10)
            log.steps(2.1, rank, pid, 11, 20)
            log.end(3.2, rank, pid, 20)
        kills = [Kill(T0 + 1.0, "worker_kill", "rank 1 pid 11", (1,)),
                 Kill(T0 + 1.2, "worker_kill", "rank 2 pid 12", (2,))]
        s = check(log.lines, kills, agents(), 3, 3, BOUND, T0 + 10, T0)
        self.assertEqual(kinds(s), [])
        self.assertEqual(s.recoveries, ["formed", "formed"])

    def test_a_frozen_survivor_replaced_in_place_is_not_a_restart(self):
        # Ranks 0-2; rank 1 killed at 1.0; rank 2 SIGSTOPped during the recovery past the store's
        # liveness, fenced and replaced (pid 22); rank 0 kept: formed, when rank 2 was frozen.
        log = Log()
        for rank in range(3):
            log.start(0.0, rank, 10 + rank)
            log.steps(0.5, rank, 10 + rank, 1, 10)
        log.start(1.5, 1, 21, restart=1, generation=1)
        log.start(8.0, 2, 22, restart=2, generation=2)
        for rank, pid in ((0, 10), (1, 21), (2, 22)):
            log.enter(9.0, rank, pid, 10)
            log.steps(9.1, rank, pid, 11, 20)
            log.end(10.2, rank, pid, 20)
        kills = [Kill(T0 + 1.0, "worker_kill", "rank 1 pid 11", (1,))]
        s = check(log.lines, kills, agents(), 3, 3, BOUND, T0 + 11, T0)
        self.assertEqual(kinds(s), ["restart without a reason"])
        s = check(log.lines, kills, agents(), 3, 3, BOUND, T0 + 11, T0, frozen={2})
        self.assertEqual(kinds(s), [])
        self.assertEqual(s.recoveries, ["formed"])

    def test_an_older_generations_replacement_may_start_after_a_newer_ones(self):
        log, kills = formed_recovery()
        log.start(2.5, 0, 30, restart=2, generation=2)
        log.start(2.6, 1, 31, restart=1, generation=1)
        self.assertNotIn("restart count", kinds(run(log, kills)))
        log.start(2.7, 1, 32, restart=1, generation=2)  # a replacement of 2 with 1's count
        self.assertIn("restart count", kinds(run(log, kills)))

    def test_exit_codes_follow_the_job(self):
        log, kills = formed_recovery()
        self.assertEqual(kinds(run(log, kills, agents(1))), ["exit codes"])
        log = first_round(3)
        self.assertEqual(kinds(run(log, [], agents(0))), ["exit codes"])
        killed = [AgentExit("0", 0), AgentExit("1", -9, killed=True)]
        log, kills = formed_recovery()
        self.assertEqual(kinds(run(log, kills, killed)), [])


if __name__ == "__main__":
    unittest.main()
