"""gateway/daphne_upgrades.py: agents' upgrades a few per turn of the loop, in order, with
whatever else the loop has to do (a page's next step) between the turns' batches."""

import asyncio

from gateway.daphne_upgrades import UpgradeTurns


def test_upgrades_beyond_a_turns_share_wait_for_later_turns_in_order_and_a_page_goes_between():
    done = []

    async def burst():
        loop = asyncio.get_running_loop()
        turns = UpgradeTurns(4, loop.call_soon)
        waited = [turns.admit(lambda n=n: done.append(f"agent {n}")) for n in range(10)]
        assert waited == [False] * 4 + [True] * 6
        loop.call_soon(done.append, "page")  # a page's next step, ready in the next turn
        while turns.waiting or turns.next_turn_called:
            await asyncio.sleep(0)
        return turns

    turns = asyncio.run(burst())

    assert done == ["agent 0", "agent 1", "agent 2", "agent 3",
                    "agent 4", "agent 5", "agent 6", "agent 7",
                    "page",
                    "agent 8", "agent 9"]
    assert turns.done_this_turn == 0


def test_an_upgrade_in_a_quiet_turn_is_done_at_once():
    done = []

    async def one_at_a_time():
        loop = asyncio.get_running_loop()
        turns = UpgradeTurns(4, loop.call_soon)
        for n in range(6):
            assert turns.admit(lambda n=n: done.append(n)) is False
            assert done[-1] == n  # not waiting: fewer than 4 this turn
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    asyncio.run(one_at_a_time())
    assert done == [0, 1, 2, 3, 4, 5]
