"""Receipt handles: opaque, naming the queue and the lease token; anything else is refused."""

import pytest

from vqueues.api.sqs.handles import decode_handle, encode_handle

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("queue", ["q", "orders.fifo", "a-b_c" * 16])
def test_a_handle_gives_back_its_queue_and_token(queue):
    handle = encode_handle(queue, "12.3.5f0c2a9e41b7")
    assert decode_handle(handle) == (queue, "12.3.5f0c2a9e41b7")
    assert "=" not in handle and "+" not in handle and "/" not in handle


@pytest.mark.parametrize("handle", [None, 7, "", "vq1.", "garbage", "vq1.!!!!",
                                    encode_handle("q", "x")[:-2], "vq1." + "A" * 2000,
                                    encode_handle("q", "not.a.token.at.all"),
                                    encode_handle("", "1.1")])
def test_what_is_not_a_handle_is_refused(handle):
    assert decode_handle(handle) is None
