"""Python reference of dtrain's sample order (libs/data/sampler.h).

Reference training scripts (PyTorch) import this module so that they visit
Fashion-MNIST in exactly the order the C++ DataLoader uses:

    from epoch_order import epoch_order, shard_order
    order = shard_order(epoch_order(len(ds), seed, epoch), rank, world_size)

The algorithm must stay identical to EpochOrder/ShardOrder in sampler.cc;
libs/data/sampler_test.cc checks golden values printed by this file
(`python3 libs/data/epoch_order.py`). Pure Python, no dependencies.
"""

MASK64 = (1 << 64) - 1


def splitmix64_next(state):
    """Returns (new_state, output) of one SplitMix64 step on a uint64 state."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def epoch_order(n, seed, epoch, shuffle=True):
    """Order in which to visit samples 0..n-1 in `epoch` (a list of ints).

    Fisher-Yates over [0, n) driven by SplitMix64 seeded with
    seed ^ (uint64(epoch) * 0xD1B54A32D192ED03); identity when not shuffling.
    """
    order = list(range(max(n, 0)))
    if not shuffle:
        return order
    state = ((seed & MASK64) ^ (((epoch & MASK64) * 0xD1B54A32D192ED03) & MASK64)) & MASK64
    for i in range(n - 1, 0, -1):
        state, r = splitmix64_next(state)
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def shard_order(order, rank, world_size):
    """Rank's share: order[rank::world_size], truncated to len(order) // world_size."""
    if world_size < 1:
        raise ValueError("world_size must be at least 1, got %d" % world_size)
    if not 0 <= rank < world_size:
        raise ValueError("rank must be in [0, %d), got %d" % (world_size, rank))
    return order[rank::world_size][: len(order) // world_size]


if __name__ == "__main__":
    # Golden values used by sampler_test.cc.
    s = 1234567
    outs = []
    for _ in range(3):
        s, r = splitmix64_next(s)
        outs.append(r)
    print("splitmix64(1234567):", outs)
    print("epoch_order(10, 0, 0):", epoch_order(10, 0, 0))
    print("epoch_order(10, 42, 1):", epoch_order(10, 42, 1))
    print("epoch_order(10, 42, 2):", epoch_order(10, 42, 2))
    print("epoch_order(16, 2**64 - 1, -1):", epoch_order(16, 2**64 - 1, -1))
    print("epoch_order(60000, 42, 3)[:8]:", epoch_order(60000, 42, 3)[:8])
    print("epoch_order(60000, 42, 3)[-4:]:", epoch_order(60000, 42, 3)[-4:])
    print("shard_order(epoch_order(10, 42, 1), 1, 3):", shard_order(epoch_order(10, 42, 1), 1, 3))
