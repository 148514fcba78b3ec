"""Checks epoch_order.py against the golden values that sampler_test.cc holds.

Both files must change together: if this test fails, the Python reference no
longer visits samples in the order the C++ DataLoader uses.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from epoch_order import epoch_order, shard_order, splitmix64_next  # noqa: E402


class EpochOrderTest(unittest.TestCase):
    def test_splitmix64_reference(self):
        state, outs = 1234567, []
        for _ in range(3):
            state, r = splitmix64_next(state)
            outs.append(r)
        self.assertEqual(outs, [6457827717110365317, 3203168211198807973, 9817491932198370423])

    def test_golden_orders(self):
        self.assertEqual(epoch_order(10, 0, 0), [6, 3, 2, 9, 8, 1, 4, 7, 0, 5])
        self.assertEqual(epoch_order(10, 42, 1), [7, 5, 8, 0, 9, 6, 2, 1, 4, 3])
        self.assertEqual(epoch_order(10, 42, 2), [9, 0, 3, 8, 1, 2, 6, 7, 5, 4])
        self.assertEqual(epoch_order(16, 2**64 - 1, -1),
                         [8, 13, 0, 10, 6, 5, 7, 4, 1, 14, 12, 3, 11, 2, 9, 15])
        big = epoch_order(60000, 42, 3)
        self.assertEqual(big[:8], [51749, 40203, 46307, 56485, 7861, 17120, 17428, 57178])
        self.assertEqual(big[-4:], [47379, 58118, 37495, 1589])
        self.assertEqual(sorted(big), list(range(60000)))

    def test_no_shuffle_and_edge_sizes(self):
        self.assertEqual(epoch_order(5, 42, 7, shuffle=False), [0, 1, 2, 3, 4])
        self.assertEqual(epoch_order(0, 1, 1), [])
        self.assertEqual(epoch_order(-3, 1, 1), [])
        self.assertEqual(epoch_order(1, 1, 1), [0])

    def test_shard_order(self):
        self.assertEqual(shard_order(epoch_order(10, 42, 1), 1, 3), [5, 9, 1])
        order = list(range(10))
        self.assertEqual([len(shard_order(order, r, 4)) for r in range(4)], [2, 2, 2, 2])
        for rank, world_size in [(0, 0), (2, 2), (-1, 2)]:
            with self.assertRaises(ValueError):
                shard_order(order, rank, world_size)


if __name__ == "__main__":
    unittest.main()
