"""The group thread's events reach the loop in order, held while a restore is under way."""

import asyncio

from vqueues.ownership.group_inbox import MAX_PENDING_BATCHES, GroupInbox


async def test_events_are_applied_in_order_and_held_while_a_restore_runs():
    inbox = GroupInbox(asyncio.get_running_loop())
    runner = asyncio.ensure_future(inbox.run())
    seen = []
    try:
        held = inbox.hold()
        await asyncio.to_thread(inbox.post, lambda: seen.append(1), True)
        inbox.post(lambda: seen.append(2))
        await asyncio.sleep(0.05)
        assert seen == []  # the restore comes first
        inbox.release(held)
        for _ in range(100):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.005)
        assert seen == [1, 2]
    finally:
        runner.cancel()


async def test_the_group_thread_waits_when_too_many_batches_are_pending():
    inbox = GroupInbox(asyncio.get_running_loop())
    for _ in range(MAX_PENDING_BATCHES):  # nothing applies them yet
        await asyncio.to_thread(inbox.post, lambda: None, True)
    blocked = asyncio.ensure_future(asyncio.to_thread(inbox.post, lambda: None, True))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    runner = asyncio.ensure_future(inbox.run())
    try:
        await asyncio.wait_for(blocked, 5)
    finally:
        runner.cancel()


async def test_an_event_that_fails_is_logged_and_the_next_applied(caplog):
    inbox = GroupInbox(asyncio.get_running_loop())
    runner = asyncio.ensure_future(inbox.run())
    seen = []

    def boom():
        raise RuntimeError("boom")

    try:
        inbox.post(boom)
        inbox.post(lambda: seen.append("next"))
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.005)
        assert seen == ["next"] and "group_event_failed" in caplog.text
    finally:
        runner.cancel()
