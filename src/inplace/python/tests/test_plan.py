"""The restore's plan as a table: which step every rank is brought to, and where each part comes from."""

import unittest

from muster_inplace._plan import NONE, LostStateError, Plan, Row, plan

# Parts: "all" (a replicated state: DDP), "s0"/"s1" (one shard each: FSDP2, or HSDP's two shards).


def rows(*table: tuple[int, str, str]) -> list[Row]:
    return [Row(version, held, needed, f"place {needed}") for version, held, needed in table]


class PlanTable(unittest.TestCase):
    def test_the_table(self) -> None:
        cases = [
            # (what: rows, want: (version, sources) or the lost rank)
            ("a first start: nothing kept, nothing moved", rows((NONE, "", "all"), (NONE, "", "all")), (0, {})),
            (
                "DDP, rank 1 started again: it receives from the lowest holder",
                rows((7, "all", "all"), (NONE, "", "all"), (7, "all", "all"), (7, "all", "all")),
                (7, {1: 0}),
            ),
            (
                "DDP, a holder one step ahead (it passed the vote): the others roll forward from it",
                rows((7, "all", "all"), (NONE, "", "all"), (8, "all", "all")),
                (8, {0: 2, 1: 2}),
            ),
            (
                "HSDP 2x2, rank 1 (replica 0, shard 1) lost: it receives from rank 3 (replica 1, shard 1)",
                rows((5, "s0", "s0"), (NONE, "", "s1"), (5, "s0", "s0"), (5, "s1", "s1")),
                (5, {1: 3}),
            ),
            (
                "HSDP: the only holder of shard 1 is a step behind: every rank goes back to it",
                rows((6, "s0", "s0"), (NONE, "", "s1"), (5, "s0", "s0"), (5, "s1", "s1")),
                (5, {0: 2, 1: 3}),
            ),
            (
                "a rank whose place changed with the world (re-numbered) receives its new part",
                rows((3, "s1", "s0"), (3, "s0", "s1")),
                (3, {0: 1, 1: 0}),
            ),
            ("FSDP2, rank 1's shard is gone: lost", rows((4, "s0", "s0"), (NONE, "", "s1")), 1),
            ("no step every shard is held at: lost", rows((6, "s0", "s0"), (5, "s1", "s1"), (NONE, "", "s1"), (NONE, "", "s0")), 1),
        ]
        for what, table, want in cases:
            with self.subTest(what):
                if isinstance(want, int):
                    with self.assertRaises(LostStateError) as lost:
                        plan(table)
                    self.assertEqual(lost.exception.rank, want)
                    self.assertIn(f"place {table[want].needed}", str(lost.exception))
                else:
                    version, sources = want
                    self.assertEqual(plan(table), Plan(version, sources, reformation=version != 0 or bool(sources)))

    def test_a_holder_never_receives(self) -> None:
        got = plan(rows((9, "all", "all"), (NONE, "", "all"), (9, "all", "all")))
        self.assertEqual(set(got.sources), {1})


if __name__ == "__main__":
    unittest.main()
