#!/usr/bin/python3
"""Tests of the chaos driver's judge (chaos_checks.py) on synthetic runs: each invariant is
caught when broken and stays quiet when kept, so a violation the driver reports is the run's,
not the checker's. Standard library only; run by CTest ("chaos checks: ...")."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_checks import Agent, Fault, check_iteration, root_cause  # noqa: E402

HB = 2.0
T0 = 1_000_000.0   # a wall time (s)


def line(t, host, pid, agent, restart, rank, world, master, event):
    return f"{int((T0 + t) * 1e9)} {host} {pid} {agent} {restart} {rank} {rank} {world} {master} {event}\n"


def worker(host, pid, agent, restart, rank, world, master, start, end, event="end"):
    """A worker's lines from `start` to `end` (alive every 0.1 s), ending with `event`."""
    text = line(start, host, pid, agent, restart, rank, world, master, "start")
    t = start + 0.1
    while t < end:
        text += line(t, host, pid, agent, restart, rank, world, master, "alive")
        t += 0.1
    return text + line(end, host, pid, agent, restart, rank, world, master, event)


def agent(name, host, pid, code, started=0.0, output=""):
    return Agent(name, host, pid, "initial", T0 + started, T0 + 5, code, output=output)


def kinds(summary):
    return sorted({v.kind for v in summary.violations})


class RoundsTest(unittest.TestCase):
    def test_sequential_rounds_after_a_restart_are_clean(self):
        text = (worker(0, 10, 1, 0, 0, 2, "a:1", 0.0, 1.0, "term")
                + worker(1, 11, 2, 0, 1, 2, "a:1", 0.0, 1.0, "term")
                + worker(0, 12, 1, 1, 0, 2, "a:2", 1.01, 2.0)
                + worker(1, 13, 2, 1, 1, 2, "a:2", 1.01, 2.0))
        s = check_iteration([agent("h0", 0, 1, 0), agent("h1", 1, 2, 0)], text, [], HB, 3)
        self.assertEqual(kinds(s), [])
        self.assertTrue(s.succeeded)
        self.assertAlmostEqual(s.min_gap_s, 0.01, places=3)

    def test_two_rank_zeros_at_once_are_a_split_brain(self):
        text = (worker(0, 10, 1, 0, 0, 1, "a:1", 0.0, 2.0)
                + worker(1, 11, 2, 0, 0, 1, "b:1", 1.0, 3.0))
        s = check_iteration([agent("h0", 0, 1, 0), agent("h1", 1, 2, 0)], text, [], HB, 3)
        self.assertIn("split brain (two rank 0s)", kinds(s))

    def test_a_straggler_without_rank_zero_is_an_overlap(self):
        text = (worker(0, 10, 1, 0, 0, 2, "a:1", 0.0, 1.0, "term")
                + worker(1, 11, 2, 0, 1, 2, "a:1", 0.0, 1.5, "term")
                + worker(0, 12, 1, 1, 0, 1, "a:2", 1.2, 2.0))
        s = check_iteration([agent("h0", 0, 1, 0), agent("h1", 1, 2, 0)], text, [], HB, 3)
        self.assertEqual(kinds(s), ["rounds overlap"])

    def test_a_frozen_agents_straggler_is_excused_until_it_can_fence(self):
        text = (worker(0, 10, 1, 0, 0, 2, "a:1", 0.0, 1.0, "term")
                + worker(1, 11, 2, 0, 1, 2, "a:1", 0.0, 3.5, "term")
                + worker(0, 12, 1, 0, 0, 1, "a:2", 2.6, 4.0))
        frozen = Fault("agent_stop", T0 + 0.5, T0 + 3.0, (2,))
        s = check_iteration([agent("h0", 0, 1, 0), agent("h1", 1, 2, 1)], text, [frozen], HB, 3)
        self.assertEqual(kinds(s), [])
        self.assertAlmostEqual(s.excused_overlap_s, 0.9, places=2)
        late = Fault("agent_stop", T0 + 0.2, T0 + 0.3, (2,))   # thawed 3.2 s before: no excuse
        s = check_iteration([agent("h0", 0, 1, 0), agent("h1", 1, 2, 0)], text, [late], HB, 3)
        self.assertEqual(kinds(s), ["rounds overlap"])

    def test_rank_twice_restart_back_and_over_budget(self):
        text = (worker(0, 10, 1, 2, 0, 2, "a:1", 0.0, 1.0, "term")
                + worker(1, 11, 2, 2, 0, 2, "a:1", 0.0, 1.0, "term")
                + worker(0, 12, 1, 1, 0, 1, "a:2", 1.1, 2.0))
        s = check_iteration([agent("h0", 0, 1, 0)], text, [], HB, 1)
        self.assertEqual(kinds(s), ["rank twice in a round", "restart count over budget",
                                    "restart count went back"])


class ExitsTest(unittest.TestCase):
    ROUND = worker(0, 10, 1, 0, 0, 2, "a:1", 0.0, 2.0) + worker(1, 11, 2, 0, 1, 2, "a:1", 0.0, 2.0)

    def test_a_spare_failing_a_succeeded_job_is_caught(self):
        agents = [agent("h0", 0, 1, 0), agent("h1", 1, 2, 0), agent("h2", 2, 3, 1)]
        self.assertEqual(kinds(check_iteration(agents, self.ROUND, [], HB, 3)),
                         ["succeeded job, agent failed"])

    def test_lost_store_and_late_arrivals_are_not_judged(self):
        late = Agent("n4", 4, 4, "newcomer", T0 + 1.9, T0 + 8, 1)
        agents = [agent("h0", 0, 1, 0), agent("h1", 1, 2, 0), late]
        self.assertEqual(kinds(check_iteration(agents, self.ROUND, [], HB, 3)), [])
        cut = Fault("link_cut", T0 + 2.1, T0 + 5.0, (1,), 0, hits_store=True)
        agents = [agent("h0", 0, 1, 1), agent("h1", 1, 2, 1), agent("h2", 2, 3, 1)]
        self.assertEqual(kinds(check_iteration(agents, self.ROUND, [cut], HB, 3)), [])

    def test_a_member_killed_after_its_workers_ended_leaves_the_job_succeeded(self):
        # Seed 3825369: h1's agent was SIGKILLed after its worker's "end"; h0 exited 0. The
        # killed agent's -9 says nothing about the job, so the run counts as succeeded.
        kill = Fault("agent_kill", T0 + 2.5, T0 + 2.5, (2,))
        agents = [agent("h0", 0, 1, 0), agent("h1", 1, 2, -9)]
        s = check_iteration(agents, self.ROUND, [kill], HB, 3)
        self.assertEqual(kinds(s), [])
        self.assertTrue(s.members_exited_0)
        # Unharmed, the same -9 is a member that failed a succeeded job.
        s = check_iteration(agents, self.ROUND, [], HB, 3)
        self.assertEqual(kinds(s), ["succeeded job, agent failed"])
        self.assertFalse(s.members_exited_0)

    def test_exit_0_without_a_completed_round(self):
        text = worker(0, 10, 1, 0, 0, 2, "a:1", 0.0, 1.0, "term") + worker(
            1, 11, 2, 0, 1, 2, "a:1", 0.0, 1.0, "term")
        agents = [agent("h0", 0, 1, 0), agent("h1", 1, 2, 1)]
        self.assertEqual(kinds(check_iteration(agents, text, [], HB, 3)),
                         ["exit 0 without a completed round"])


SUMMARY = """drun: root cause: rank 1 (local_rank 0) on vm(10.0.0.1) was killed by signal SIGKILL (9)
drun:   pid: 42
drun:   time: 2026-01-01T00:00:00.000Z
drun: restart budget exhausted (1 restarts)
"""
WAITER = ("drun: rendezvous 'j': the job failed while this node waited to join it: rank 1 on "
          "vm(10.0.0.1) ended with status 137\n")


class CausesTest(unittest.TestCase):
    FAILED = (worker(0, 10, 1, 0, 0, 2, "a:1", 0.0, 1.0, "term")
              + worker(1, 11, 2, 1, 1, 2, "a:2", 1.1, 2.0, "term"))

    def test_both_shapes_of_one_cause_agree(self):
        self.assertEqual(root_cause(SUMMARY)[:3], root_cause(WAITER)[:3])
        agents = [agent("h0", 0, 1, 137, output=SUMMARY), agent("h1", 1, 2, 137, output=SUMMARY),
                  agent("h2", 2, 3, 137, output=WAITER)]
        self.assertEqual(kinds(check_iteration(agents, self.FAILED, [], HB, 1)), [])

    def test_another_cause_another_exit_code_and_an_early_spent_budget(self):
        other = SUMMARY.replace("pid: 42", "pid: 43").replace("(1 restarts)", "(2 restarts)")
        agents = [agent("h0", 0, 1, 137, output=SUMMARY), agent("h1", 1, 2, 137, output=other),
                  agent("h2", 2, 3, 1, output=WAITER)]
        self.assertEqual(kinds(check_iteration(agents, self.FAILED, [], HB, 3)),
                         ["failed job, agent exit differs", "restart count differs",
                          "root causes differ"])


if __name__ == "__main__":
    unittest.main()
