"""Partition-aware Python client for vqueues."""

from vqueues_client.client import AsyncClient
from vqueues_client.consumer import consume
from vqueues_client.errors import DeadlineExceeded, VQError
from vqueues_client.hashing import murmur2, partition_for
from vqueues_client.producer import BatchProducer
from vqueues_client.sync import Client
from vqueues_client.types import (
    EnqueueResult,
    Lease,
    LeasePage,
    NewRecord,
    ReadResult,
    Record,
    RecordResult,
    Refused,
)
from vqueues_client.worker import Worker

__all__ = [
    "AsyncClient", "BatchProducer", "Client", "DeadlineExceeded", "EnqueueResult", "Lease",
    "LeasePage", "NewRecord", "ReadResult", "Record", "RecordResult", "Refused", "VQError",
    "Worker", "consume", "murmur2", "partition_for",
]
__version__ = "0.1.0"
